"""Thread workers stuck for good: a thread cannot be killed, yet it must never hang the
run, delay an error or Ctrl-C, or abort the interpreter's exit. (That the batch the
loop waits for times out first holds for worker processes too: tested here as well.)

Samples block on a real ``threading.Event`` (a dead NFS mount); Ctrl-C is a real SIGINT;
the exit cases run a real child interpreter. Each test lets its stuck threads go at the
end (the suite checks that no thread of conveyor's outlives a test) and the autouse
``leak_check`` fixture (conftest.py) checks that nothing else is left.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import conveyor._workers.threads as thread_pool
from conveyor import DataLoader, WorkerRestartedWarning, WorkerTimeoutError
from conveyor._workers.thread_exit import INTERRUPTED_EXIT_S
from tests.helpers import exit_timing
from tests.helpers.interrupts import CHILD_ENV
from tests.helpers.sync import Mailbox, post, wait_posted

pytestmark = pytest.mark.timeout(60)

SCRIPTS = Path(__file__).parent / "scripts"
TIMEOUT = 0.5
MARGIN_S = 1.5  # a loaded two-core machine: the error may come this much past the timeout


class DeadMount:
    """Samples for which ``stuck(index)`` holds block until the test opens the mount.
    ``first_after_stuck``: sample 0 waits until a thread is stuck (so the batch after the
    one its worker runs next is stuck first, and longest)."""

    def __init__(
        self, stuck: Callable[[int], bool], length: int = 64, first_after_stuck: bool = False
    ) -> None:
        self.stuck = stuck
        self.length = length
        self.first_after_stuck = first_after_stuck
        self.mount = threading.Event()
        self.entered = threading.Event()  # a thread is stuck now
        self.fetched: list[int] = []

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        if index == 0 and self.first_after_stuck:
            self.entered.wait(30)
        if self.stuck(index):
            self.entered.set()
            self.mount.wait()
        self.fetched.append(index)
        return index


@pytest.fixture
def mounts() -> Iterator[list[DeadMount]]:
    """Datasets whose mounts are opened when the test ends: the stuck threads finish their
    sample and end, and no thread of conveyor's outlives the test."""
    made: list[DeadMount] = []
    yield made
    for dataset in made:
        dataset.mount.set()
    for thread in threading.enumerate():
        if thread.name.startswith("conveyor-worker-"):
            thread.join(10)


def _loader(dataset: DeadMount, **options: object) -> DataLoader:
    options = {"batch_size": 8, "num_workers": 4, "timeout": TIMEOUT, **options}
    return DataLoader(dataset, worker_method="thread", **options)  # type: ignore[arg-type]


def _time_the_error(it: Iterator[object]) -> tuple[float, WorkerTimeoutError]:
    """Take batches until the timeout; the seconds from asking for the last one to it."""
    while True:
        asked = time.monotonic()
        try:
            next(it)
        except WorkerTimeoutError as error:
            return time.monotonic() - asked, error


@pytest.mark.parametrize("stuck", ["one", "all"])
def test_a_stuck_thread_times_out_naming_the_sample_the_loop_waits_for(
    stuck: str, mounts: list[DeadMount]
) -> None:
    # "all": every sample from 21 on blocks, so each thread ends up stuck. Two workers:
    # batch 3 ([24, ...], worker 1's second) is stuck before worker 0 begins batch 2
    # ([16, ..., 21, ...]), which the loop then waits for.
    every = stuck == "all"
    dataset = DeadMount(lambda i: i >= 21 if every else i == 21, first_after_stuck=every)
    mounts.append(dataset)
    after, error = _time_the_error(iter(_loader(dataset, num_workers=2)))
    assert after < TIMEOUT + MARGIN_S, f"the timeout came {after:.1f} s after the ask"
    text = str(error)
    assert "batch 2 (dataset indices [16, 17, 18, 19, 20, 21, 22, 23])" in text, text
    assert "mount.wait()" in text  # the stuck thread's stack
    assert "The thread was abandoned" in text


def test_ctrl_c_is_not_delayed_by_a_stuck_thread_which_then_runs_nothing_more(
    mounts: list[DeadMount],
) -> None:
    dataset = DeadMount(lambda i: i == 21)
    mounts.append(dataset)
    sent: list[float] = []

    def interrupt_once_stuck() -> None:
        dataset.entered.wait(30)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, delivered to the main thread

    loader = _loader(dataset, timeout=0)  # no timeout: only Ctrl-C ends the wait
    threading.Thread(target=interrupt_once_stuck, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        for _ in loader:
            pass
    late = time.monotonic() - sent[0]
    assert late < MARGIN_S, f"KeyboardInterrupt came {late:.1f} s after Ctrl-C"
    stuck = [t for t in threading.enumerate() if t.name.startswith("conveyor-worker-")]
    fetched = len(dataset.fetched)
    dataset.mount.set()  # the stuck sample returns: its thread ends, running nothing else
    for thread in stuck:
        thread.join(10)
    assert not [t for t in stuck if t.is_alive()]
    assert dataset.fetched[fetched:] in ([21], [21, 22, 23])  # the rest of its own batch


def test_on_timeout_restart_replaces_a_stuck_thread_and_loses_nothing(
    mounts: list[DeadMount],
) -> None:
    first = threading.Event()

    def once(index: int) -> bool:  # index 21 blocks the first time it is fetched only
        if index != 21 or first.is_set():
            return False
        first.set()
        return True

    dataset = DeadMount(once, length=40)
    mounts.append(dataset)
    loader = _loader(dataset, on_timeout="restart", batch_size=4)
    with pytest.warns(WorkerRestartedWarning, match="so conveyor abandoned it") as record:
        got = [i for batch in loader for i in batch.tolist()]
    assert got == list(range(40))  # in order, each once: the stuck one's reply is dropped
    assert "a thread cannot be killed" in str(record[0].message)
    statistics = loader.statistics()
    assert statistics is not None and statistics.worker_restarts == 1


def test_on_timeout_restart_stops_abandoning_threads_past_the_cap(
    mounts: list[DeadMount], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(thread_pool, "MAX_ABANDONED", 1)
    dataset = DeadMount(lambda i: i == 5, length=16)  # stuck every time
    mounts.append(dataset)
    loader = _loader(dataset, on_timeout="restart", batch_size=2, num_workers=2)
    with pytest.warns(WorkerRestartedWarning), pytest.raises(WorkerTimeoutError) as caught:
        list(loader)
    assert "It was not replaced: 1 thread workers abandoned earlier are still stuck" in str(
        caught.value
    )


# --- the same rule for worker processes ------------------------------------------------


class DeadMountFrom:
    """Every sample from ``first`` on blocks for good (a dead network mount); sample 0
    waits until one is stuck (a post to the mailbox at ``stuck``)."""

    def __init__(self, first: int, stuck: str) -> None:
        self.first = first
        self.stuck = stuck

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> int:
        if index == 0:
            wait_posted(self.stuck)
        if index >= self.first:
            post(self.stuck, str(index))
            threading.Event().wait()  # nothing sets it: teardown kills the worker
        return index


@pytest.mark.slow  # waits out a timeout, then teardown's grace for the other stuck worker
def test_with_every_worker_process_stuck_the_batch_waited_for_times_out(
    tmp_path: Path,
) -> None:
    """Batch 3 ([24, ...]: worker 1's second) is stuck before worker 0, held back by
    sample 0, begins batch 2 ([16, ..., 21, ...]), which the loop then waits for. Batch
    3's worker was timed out and killed again and again (the loop spun a core and never
    raised); now batch 2's times out."""
    with Mailbox(tmp_path / "stuck") as box:
        loader = DataLoader(
            DeadMountFrom(21, box.path), batch_size=8, num_workers=2, timeout=1,
            multiprocessing_context="fork",
        )  # fmt: skip
        with pytest.raises(WorkerTimeoutError, match=r"on batch 2 \(dataset indices \[16, 17"):
            list(loader)


# --- the interpreter's exit, in a child interpreter -------------------------------------


def _read_line(child: subprocess.Popen[str], timeout: float) -> str:
    assert child.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(child.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            child.kill()
            _, err = child.communicate()
            pytest.fail(f"the child said nothing for {timeout:.0f} s; stderr:\n{err}")
    return child.stdout.readline()


# What is bounded is conveyor's part of the exit, measured inside the child
# (tests/helpers/exit_timing.py): timed from outside, the interpreter's own teardown of
# torch took from under a second to over ten on two cores loaded twentyfold (4.3 s
# against a bound of 4 on CI), and a bound on that was a bound on the machine's load.
EXIT_S = 2.0  # conveyor's exit, at once: a timed wait's overshoot on busy cores at most


@pytest.mark.slow  # a child interpreter that imports torch, and waits out a timeout
@pytest.mark.timeout(240)  # (its start-up alone took 40 s on two cores loaded twentyfold)
@pytest.mark.parametrize("stuck", ["one", "all"])
def test_after_a_stuck_threads_timeout_the_interpreter_exits_at_once(stuck: str) -> None:
    timeout = 2.0
    child = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "dead_mount.py"), stuck, str(timeout)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=CHILD_ENV,
    )  # fmt: skip
    with child:
        report = json.loads(_read_line(child, 120.0))  # the error is leaving the script
        _, err = child.communicate(timeout=120)
    assert report["after_s"] < timeout + MARGIN_S, report
    assert "dataset indices [16, 17, 18, 19, 20, 21, 22, 23]" in report["error"]
    waited = exit_timing.seconds(err)
    assert waited < EXIT_S, f"conveyor's part of the exit took {waited:.1f} s:\n{err}"
    assert child.returncode == 1 and "WorkerTimeoutError" in err, err


@pytest.mark.slow  # a child interpreter that imports torch
@pytest.mark.timeout(240)
def test_ctrl_c_with_a_thread_stuck_for_good_ends_the_program_at_once() -> None:
    """No timeout: the thread is not known to be stuck, yet the program ends on Ctrl-C
    (close() gave the thread 5 s, and the exit waited for it without bound; now close()
    gives it half a second, and the exit 1 s at most)."""
    child = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "ctrl_c_stuck_thread.py")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=CHILD_ENV,
    )  # fmt: skip
    with child:
        assert _read_line(child, 120.0) == "stuck\n"
        _, err = child.communicate(timeout=120)  # it ends (it waited for good before)
    assert child.returncode == -signal.SIGINT, err
    waited = exit_timing.seconds(err)
    assert waited < INTERRUPTED_EXIT_S + MARGIN_S, f"conveyor's exit took {waited:.1f} s:\n{err}"
    assert "\nKeyboardInterrupt\n" in err, err
    assert "without waiting for thread workers still in a sample after Ctrl-C" in err
    assert "conveyor-worker-0 (batch 2" in err and "self.mount.wait()" in err  # named


@pytest.mark.slow  # a child interpreter that imports torch and runs it for seconds
@pytest.mark.timeout(240)
@pytest.mark.torch
def test_a_script_ending_while_threads_run_torch_exits_with_status_0() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "exit_inside_torch.py")],
        capture_output=True, text=True, timeout=120, env=CHILD_ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "terminate called" not in done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "took a batch" and "finished" in done.stdout  # it waited for them
