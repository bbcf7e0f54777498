"""Ctrl-C with a thread worker stuck for good, no ``timeout`` set; the script catches
the KeyboardInterrupt (as Lightning does, to tear down gracefully) and returns. The
interpreter's exit must wait for the stuck thread a second at most, and say on the
``conveyor`` logger which thread it left.

Dataset index 5 blocks on a real ``threading.Event`` that nothing sets (a read on a dead
network mount); once a thread is stuck there the script prints ``stuck``, and the test
sends this process a real SIGINT. The script prints ``returning`` as it returns; its
exit writes how long conveyor's part of it took (tests/helpers/exit_timing.py).

``python ctrl_c_caught.py step``: the Ctrl-C lands in the training step instead, never
in the loader's ``next()``: after its first batch the loop waits (on another Event
nothing sets) until the thread is stuck, prints ``in step``, and waits there for good.
"""

from __future__ import annotations

import sys
import threading

from tests.helpers import exit_timing

exit_timing.outer()
from conveyor import DataLoader  # noqa: E402  (after the exit's outer bracket)


class DeadMount:
    def __init__(self) -> None:
        self.mount = threading.Event()
        self.stuck = threading.Event()

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> int:
        if index == 5:
            print("stuck", flush=True)
            self.stuck.set()  # (after the line is whole: the step's own line comes next)
            self.mount.wait()
        return index


def main(in_step: bool) -> None:
    dataset = DeadMount()
    loader = DataLoader(dataset, batch_size=2, num_workers=2, worker_method="thread")
    exit_timing.inner()
    try:
        for _batch in loader:
            if in_step:  # a training step that outlasts the thread's start on index 5
                dataset.stuck.wait()
                print("in step", flush=True)
                threading.Event().wait()
    except KeyboardInterrupt:
        pass  # caught, as a framework catches it to tear down
    print("returning", flush=True)


if __name__ == "__main__":
    main(in_step=sys.argv[1:] == ["step"])
