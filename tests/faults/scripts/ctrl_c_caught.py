"""Ctrl-C with a thread worker stuck for good, no ``timeout`` set; the script catches
the KeyboardInterrupt (as Lightning does, to tear down gracefully) and returns. The
interpreter's exit must wait for the stuck thread a second at most, and say on the
``conveyor`` logger which thread it left.

Dataset index 5 blocks on a real ``threading.Event`` that nothing sets (a read on a dead
network mount); once a thread is stuck there the script prints ``stuck``, and the test
sends this process a real SIGINT. The script prints ``returning`` as it returns; its
exit writes how long conveyor's part of it took (tests/helpers/exit_timing.py).
"""

from __future__ import annotations

import threading

from tests.helpers import exit_timing

exit_timing.outer()
from conveyor import DataLoader  # noqa: E402  (after the exit's outer bracket)


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
    loader = DataLoader(DeadMount(), batch_size=2, num_workers=2, worker_method="thread")
    exit_timing.inner()
    try:
        for _batch in loader:
            pass
    except KeyboardInterrupt:
        pass  # caught, as a framework catches it to tear down
    print("returning", flush=True)


if __name__ == "__main__":
    main()
