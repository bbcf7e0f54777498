"""A training script that ends (as ``max_steps`` ends one) while each of its thread
workers is in the middle of a batch of slow samples: its exit must wait for the sample
each thread is running, not for the rest of its batch.

Usage: ``python exit_mid_batch.py SAMPLE_S``. Two thread workers, batches of 4; every
sample from index 4 on runs torch operations for ``SAMPLE_S`` seconds (an augmentation on
a loaded node; torch releases the GIL inside each operation). The script takes the
first batch (samples 0-3, quick), prints ``took a batch`` and returns without closing
anything; its exit writes how long conveyor's part of it took (tests/helpers/
exit_timing.py). Each slow sample prints ``began INDEX`` and ``finished INDEX`` (each line
written at once: print's text and its newline, written apart, interleave across threads).
"""

from __future__ import annotations

import sys
import time

import torch
from tests.helpers import exit_timing

exit_timing.outer()
from conveyor import DataLoader  # noqa: E402  (after the exit's outer bracket)

SAMPLE_S = float(sys.argv[1])


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Augmented:
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        x = torch.randn(64, 64)
        if index < 4:
            return x.sum()
        _say(f"began {index}")
        end = time.monotonic() + SAMPLE_S
        while time.monotonic() < end:
            x = torch.tanh(x @ x.T / 64)
        _say(f"finished {index}")
        return x.sum()


loader = DataLoader(Augmented(), batch_size=4, num_workers=2, worker_method="thread")
exit_timing.inner()
for _batch in loader:
    _say("took a batch")
    break
