"""Lose the Ray cluster while the loader waits for a batch (run by test_ray_faults.py).

Starts a local cluster of its own (``argv[1]``: a short temporary directory), takes one
batch from Ray workers, then kills every process of the cluster (a head machine lost,
with its workers; the driver goes on, as if elsewhere) while the worker holds the next
batch. Prints the error, and whether the state taken after it resumes exactly with
process workers.
"""

from __future__ import annotations

import os
import sys

import psutil
import ray

from conveyor import ClusterLostError, DataLoader, get_worker_info
from conveyor._workers import ray_pool

ray_pool.PROBE_EVERY_S = 1.0  # ask the head every second, not every ten: a quicker test

TEMP = sys.argv[1]
GATE = os.path.join(TEMP, "gate")


class Held:
    """Indices from 2 on never come from a Ray worker: their fetch blocks on a FIFO
    nobody opens. Process workers fetch them at once."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        info = get_worker_info()
        if i >= 2 and info is not None and info.worker_method == "ray":
            with open(GATE):
                pass
        return i


def main() -> None:
    os.mkfifo(GATE)
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=os.path.join(TEMP, "ray"),
    )
    loader = DataLoader(
        Held(), batch_size=2, num_workers=1, worker_method="ray", worker_options={"num_cpus": 1}
    )
    it = iter(loader)
    next(it)
    cluster = psutil.Process().children(recursive=True)
    print("PIDS", *(proc.pid for proc in cluster), flush=True)
    for proc in cluster:
        proc.kill()
    try:
        next(it)
    except ClusterLostError as exc:
        print(f"ClusterLostError: {exc}", flush=True)
    state = loader.state_dict()
    resumed = DataLoader(
        Held(), batch_size=2, num_workers=1, multiprocessing_context="fork", preflight=False
    )
    resumed.load_state_dict(state)
    got = [batch.tolist() for batch in resumed]
    print("resumes at batch 1" if got == [[2, 3], [4, 5], [6, 7]] else f"resumed: {got}")
    print("LEFT", *(proc.pid for proc in psutil.Process().children(recursive=True)), flush=True)


if __name__ == "__main__":
    main()
