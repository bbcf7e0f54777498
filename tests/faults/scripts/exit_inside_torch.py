"""A training script that ends (as ``max_steps`` ends one) while its thread workers run
torch operations: it must exit with status 0.

Each sample after the first batch runs torch operations for ``SAMPLE_S`` seconds (an
augmentation on a loaded node); the script takes one batch and ends. The loader's own
grace for busy threads is shrunk to nothing, so the exit cannot depend on that timing.
Prints ``took a batch`` when it has its batch, and each sample prints ``finished
INDEX`` when its torch work is done. The script ends only once a worker is inside a
sample's torch work (on loaded cores the threads may not have begun one when the first
batch comes: the exit would then have nothing to wait for).
"""

from __future__ import annotations

import threading
import time

import torch

import conveyor._workers.threads
from conveyor import DataLoader

SAMPLE_S = 2.0
IN_TORCH = threading.Event()  # a worker thread has begun a sample's torch work
conveyor._workers.threads.STOP_GRACE_S = 0.01
conveyor._workers.threads.CLOSE_JOIN_S = 0.01


class Augmented:
    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> torch.Tensor:
        x = torch.randn(64, 64)
        if index < 2:
            return x.sum()
        IN_TORCH.set()
        end = time.monotonic() + SAMPLE_S
        while time.monotonic() < end:  # torch releases the GIL inside each operation
            x = torch.tanh(x @ x.T / 64)
        print(f"finished {index}", flush=True)
        return x.sum()


loader = DataLoader(Augmented(), batch_size=2, num_workers=2, worker_method="thread")
for _batch in loader:
    print("took a batch", flush=True)
    if not IN_TORCH.wait(timeout=60):
        raise SystemExit("no worker thread began a sample's torch work within 60 s")
    break
