"""A dead network mount under thread workers: the training script's error, then its exit.

Usage: ``python dead_mount.py one|all TIMEOUT``. Four thread workers, batches of 8;
dataset index 21 (``one``), or every index from 21 on (``all``: every thread ends up
stuck), blocks on a real ``threading.Event`` that nothing sets, as a read on a dead NFS
mount blocks. The script takes batches until the loader raises; just before the error
leaves the script (uncaught, as in a training run), it prints one JSON line: the
seconds from asking for the batch that never came to the error, and the error's text.
The exit writes how long conveyor's part of it took (tests/helpers/exit_timing.py).
"""

from __future__ import annotations

import json
import sys
import threading
import time

from tests.helpers import exit_timing

exit_timing.outer()
from conveyor import DataLoader  # noqa: E402  (after the exit's outer bracket)

STUCK = 21


class DeadMount:
    def __init__(self, every: bool) -> None:
        self.every = every
        self.mount = threading.Event()  # never set: the mount never answers

    def __len__(self) -> int:
        return 200

    def __getitem__(self, index: int) -> int:
        if index == STUCK or (self.every and index > STUCK):
            self.mount.wait()
        return index


def main() -> None:
    every, timeout = sys.argv[1] == "all", float(sys.argv[2])
    loader = DataLoader(
        DeadMount(every), batch_size=8, num_workers=4, worker_method="thread", timeout=timeout
    )
    exit_timing.inner()
    it = iter(loader)
    while True:
        asked = time.monotonic()
        try:
            next(it)
        except Exception as error:
            after = time.monotonic() - asked
            print(json.dumps({"after_s": after, "error": str(error)}), flush=True)
            raise


if __name__ == "__main__":
    main()
