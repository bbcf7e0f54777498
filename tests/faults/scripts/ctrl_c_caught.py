"""Ctrl-C with a thread worker stuck for good, no ``timeout`` set; the script catches
the KeyboardInterrupt (as Lightning does, to tear down gracefully) and returns. The
interpreter's exit must wait for the stuck thread a second at most, and say on the
``conveyor`` logger which thread it left.

Dataset index 5 blocks on a real ``threading.Event`` that nothing sets (a read on a dead
network mount); once a thread is stuck there the script prints ``stuck``, and the test
sends this process a real SIGINT. The script prints ``returning`` as it returns.

With the argument ``--not-stuck`` the mount answers once the script has caught the
KeyboardInterrupt: the same program with nothing left to wait for at its exit, the
yardstick the test measures against.
"""

from __future__ import annotations

import sys
import threading

from conveyor import DataLoader


class DeadMount:
    def __init__(self) -> None:
        self.mount = threading.Event()

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> int:
        if index == 5:
            print("stuck", flush=True)
            self.mount.wait()
        return index


def main() -> None:
    dataset = DeadMount()
    try:
        for _batch in DataLoader(dataset, batch_size=2, num_workers=2, worker_method="thread"):
            pass
    except KeyboardInterrupt:
        if "--not-stuck" in sys.argv:
            dataset.mount.set()
    print("returning", flush=True)


if __name__ == "__main__":
    main()
