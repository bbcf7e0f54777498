"""Ctrl-C while a thread worker is stuck for good, no ``timeout`` set: the program must
end on its KeyboardInterrupt at once, not wait for the thread.

Dataset index 5 blocks on a real ``threading.Event`` that nothing sets (a dead network
mount); once it is stuck it prints ``stuck`` and sends a real SIGINT to this process
(Python runs the handler in the main thread, waiting in ``next()``). The
KeyboardInterrupt is left uncaught, as in a training script. The exit writes how long
conveyor's part of it took (tests/helpers/exit_timing.py).
"""

from __future__ import annotations

import os
import signal
import threading

from tests.helpers import exit_timing

exit_timing.outer()
from conveyor import DataLoader  # noqa: E402  (after the exit's outer bracket)


class DeadMount:
    def __init__(self) -> None:
        self.mount = threading.Event()  # never set

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> int:
        if index == 5:
            print("stuck", flush=True)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
            self.mount.wait()
        return index


loader = DataLoader(DeadMount(), batch_size=2, num_workers=2, worker_method="thread")
exit_timing.inner()
for _batch in loader:
    pass
