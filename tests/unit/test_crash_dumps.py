"""Reading faulthandler's dumps of a process whose workers are threads
(threads_per_worker): which core's thread a fatal signal hit, and one thread's stack."""

from __future__ import annotations

from conveyor._task.protocol import WorkerStatus
from conveyor._workers.stacks import crashed_core, thread_stack

CRASH = """Fatal Python error: Segmentation fault

Thread 0x00007f00000000aa (most recent call first):
  File "/data/dataset.py", line 12 in __getitem__
  File "/conveyor/_task.py", line 80 in fetch

Current thread 0x00007f00000000bb (most recent call first):
  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at
  File "/data/dataset.py", line 14 in __getitem__

Extension modules: numpy.core._multiarray_umath (total: 1)
"""


def _status(thread: int) -> WorkerStatus:
    return WorkerStatus(0, 0, None, -1, 0.0, thread, 0)


def test_the_crashed_core_is_the_one_whose_thread_the_dump_calls_current() -> None:
    cores = {4: _status(0x7F00000000AA), 5: _status(0x7F00000000BB)}
    assert crashed_core(CRASH, cores) == 5


def test_no_core_is_named_without_a_dump_or_for_a_thread_of_the_datasets_own() -> None:
    cores = {4: _status(0x7F00000000AA)}
    assert crashed_core("", cores) is None  # killed from outside: nothing written
    assert crashed_core(CRASH, cores) is None  # 0x...bb is no core's thread


def test_one_threads_stack_is_cut_from_a_dump_of_all() -> None:
    stack = thread_stack(CRASH, 0x7F00000000AA)
    assert stack.splitlines() == [
        "Thread 0x00007f00000000aa (most recent call first):",
        '  File "/data/dataset.py", line 12 in __getitem__',
        '  File "/conveyor/_task.py", line 80 in fetch',
    ]
    assert thread_stack(CRASH, 0x1234) == CRASH  # not there: all of it
