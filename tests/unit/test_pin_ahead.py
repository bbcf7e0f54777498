"""Pinning one batch ahead (``pin_memory=True`` with workers), without an accelerator.

The stage itself is tested with stand-in pin functions; the loop's use of it runs
over the fake pool (tests/helpers/fake_pool.py), where worker 0 is made slow so
that the next batch has always arrived when one is handed out.
"""

from __future__ import annotations

import multiprocessing
import sys
import threading
import weakref
from typing import Any

import pytest
from tests.helpers.fake_pool import FakePool
from tests.unit.test_loop import Numbers, _prepared, flat, loader, run

from conveyor import DataLoader
from conveyor._iter.multiprocess import MultiprocessIterator
from conveyor._iter.pin_ahead import THREAD_NAME, PinAhead
from conveyor._workers.start import start_process
from conveyor._workers.start_method import StartMethod
from conveyor.diagnostics.fork_hazards import running_threads


class Pinned(list[Any]):
    """A batch as the stand-in pinner returns it: a copy, and which thread made it."""

    def __init__(self, batch: Any) -> None:
        super().__init__(batch)
        self.thread = threading.current_thread().name


class Recorder:
    """Pins by copying into a :class:`Pinned`; an event per batch (by its first
    sample) fires once it is pinned."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.done: dict[int, threading.Event] = {}
        self.lock = threading.Lock()

    def event(self, first: int) -> threading.Event:
        with self.lock:
            return self.done.setdefault(first, threading.Event())

    def __call__(self, batch: Any) -> Pinned:
        first = int(batch[0])
        if first == self.fail_at:
            raise RuntimeError(f"cannot pin the batch starting at {first}")
        pinned = Pinned(batch)
        self.event(first).set()
        return pinned


def _iterator(data: DataLoader, setup: Any, pin: Any) -> MultiprocessIterator:
    """An iterator over the fake pool (``setup(pool)`` first) that pins with ``pin``."""
    FakePool.instances.clear()
    return MultiprocessIterator(data._config, data._history, pool_factory=_prepared(setup), pin=pin)


class Gated:
    """Pins (returns the batch as it is) once released; ``started`` fires as it begins."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        self.finished = False

    def __call__(self, batch: Any) -> Any:
        self.started.set()
        self.release.wait(10)
        self.finished = True
        return batch


def pin_threads_alive() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def slow_first_worker(pool: FakePool) -> None:
    pool.slow.add(0)  # worker 1's batches arrive first: the next batch is always there


# --- the stage ----------------------------------------------------------------------


class Batch:
    """A stand-in batch that records the thread its last reference died in."""

    def __init__(self, died_in: list[str]) -> None:
        weakref.finalize(self, lambda: died_in.append(threading.current_thread().name))


def test_the_stage_pins_in_its_thread_and_the_unpinned_batch_dies_in_the_main_thread() -> None:
    stage = PinAhead(lambda batch: threading.current_thread().name)
    died_in: list[str] = []
    key = object()
    stage.start(key, Batch(died_in))
    assert not stage.idle
    assert stage.take(object()) == (False, None)  # another batch: not the one ahead
    pinned, thread = stage.take(key)
    assert pinned and thread == THREAD_NAME
    assert died_in == [threading.current_thread().name]
    assert stage.idle
    stage.close()
    assert pin_threads_alive() == []


def test_a_failed_pin_is_raised_when_its_batch_is_taken() -> None:
    def pin(batch: Any) -> Any:
        raise RuntimeError("no page-locked memory left")

    stage = PinAhead(pin)
    key = object()
    stage.start(key, [1])
    with pytest.raises(RuntimeError, match="no page-locked memory left"):
        stage.take(key)
    stage.fail(key, ValueError("undecodable"))
    with pytest.raises(ValueError, match="undecodable"):
        stage.take(key)
    assert stage.idle
    stage.close()


def test_drop_waits_for_the_pin_in_flight_then_forgets_it() -> None:
    pin = Gated()
    stage = PinAhead(pin)
    key = object()
    died_in: list[str] = []
    stage.start(key, Batch(died_in))
    assert pin.started.wait(10)
    pin.release.set()
    assert stage.drop() is key
    assert pin.finished
    assert died_in == [threading.current_thread().name]
    assert stage.take(key) == (False, None)
    stage.close()
    assert pin_threads_alive() == []


def test_a_thread_that_cannot_select_the_device_fails_each_batch_instead_of_hanging() -> None:
    def use_device() -> None:
        raise RuntimeError("invalid device ordinal")

    stage = PinAhead(list, lambda: use_device)
    for _ in range(2):
        key = object()
        stage.start(key, [1])
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            stage.take(key)
    stage.close()
    assert pin_threads_alive() == []


def test_without_a_thread_the_batch_is_pinned_here_not_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    stage = PinAhead(lambda batch: (threading.current_thread().name, batch))
    key = object()
    stage.start(key, [1])
    assert stage.take(key) == (True, (threading.current_thread().name, [1]))
    stage.close()


def test_closing_from_the_pin_thread_itself_does_not_wait_for_itself() -> None:
    # The garbage collector may run the iterator's finalizer in whichever thread
    # allocates: here, in the middle of a pin.
    closed = threading.Event()
    pinned_in: list[threading.Thread] = []

    def pin(batch: Any) -> Any:
        pinned_in.append(threading.current_thread())
        stage.close()
        closed.set()
        return batch

    stage = PinAhead(pin)
    stage.start(object(), [1])
    assert closed.wait(10)
    assert stage.idle
    pinned_in[0].join(10)  # told to stop: it ends once this pin returns
    assert not pinned_in[0].is_alive()


# Python 3.12+ warns of any fork in a process with threads; this one is the subject.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_does_not_wait_for_a_pin_thread_it_does_not_have() -> None:
    pin = Gated()
    stage = PinAhead(pin)
    stage.start(object(), [1])
    assert pin.started.wait(10)
    child = multiprocessing.get_context("fork").Process(target=stage.close)
    child.start()
    child.join(10)
    hung = child.is_alive()
    if hung:
        child.kill()
        child.join()
    pin.release.set()
    stage.close()
    assert not hung and child.exitcode == 0


class Announcing:
    """Stands in for a gate's lock: says when a thread asks for it."""

    def __init__(self, lock: Any, asked: threading.Event) -> None:
        self.lock, self.asked = lock, asked

    def acquire(self) -> None:
        self.asked.set()
        self.lock.acquire()

    def release(self) -> None:
        self.lock.release()


def test_a_fork_waits_for_the_pin_in_flight() -> None:
    # fork copies only the forking thread: a pin thread copied mid-pin could leave a lock
    # it holds (the accelerator's allocator's) locked in the child for good.
    pin = Gated()
    stage = PinAhead(pin)
    key = object()
    stage.start(key, [7])
    assert pin.started.wait(10)
    asked = threading.Event()
    stage._gate._lock = Announcing(stage._gate._lock, asked)  # type: ignore[assignment]
    # The child exits 0 if the pin had finished when it was forked (it has a copy of `pin`).
    child = multiprocessing.get_context("fork").Process(
        target=lambda: sys.exit(0 if pin.finished else 1)
    )
    forker = threading.Thread(target=start_process, args=(StartMethod("fork"), child))
    forker.start()
    assert asked.wait(10)  # the fork waits for the gate...
    assert child.pid is None  # ...and has not happened
    pin.release.set()
    forker.join()
    child.join(10)
    assert child.exitcode == 0
    assert stage.take(key) == (True, [7])
    stage.close()


def test_the_fork_checks_know_the_pin_thread_as_conveyors_own() -> None:
    stage = PinAhead(list)
    key = object()
    stage.start(key, [1])
    assert stage.take(key) == (True, [1])
    (thread,) = pin_threads_alive()  # idle between batches, alive until closed
    assert thread not in running_threads()  # a second loader's fork does not warn of it
    stage.close()


def test_the_thread_starts_only_when_a_batch_is_pinned_ahead() -> None:
    stage = PinAhead(list)
    assert pin_threads_alive() == []
    stage.close()


# --- the loop -----------------------------------------------------------------------


def test_the_next_batch_is_pinned_while_the_user_holds_this_one() -> None:
    pin = Recorder()
    it = _iterator(loader(Numbers(16), in_order=True), slow_first_worker, pin)
    first = next(it)
    assert list(first) == [0, 1]
    # Nobody asked for the second batch yet: it is pinned ahead, in the stage's thread.
    assert pin.event(2).wait(10)
    batches = [first, *it]
    assert flat(batches) == list(range(16))
    assert all(isinstance(b, Pinned) for b in batches)
    # The first batch had nothing before it; later ones are pinned in the main thread
    # only where they had not arrived yet when the batch before them was handed out.
    assert batches[0].thread == threading.current_thread().name
    assert batches[1].thread == THREAD_NAME
    assert {b.thread for b in batches} == {threading.current_thread().name, THREAD_NAME}
    assert pin_threads_alive() == []  # the epoch ended: the iterator closed


def test_pinning_ahead_hands_out_the_same_batches_in_the_same_order() -> None:
    for in_order in (True, False):
        plain, _ = run(loader(Numbers(20), in_order=in_order), slow_first_worker)
        pinned = _iterator(loader(Numbers(20), in_order=in_order), slow_first_worker, Recorder())
        assert [list(b) for b in pinned] == [list(b) for b in plain]


def test_a_batch_pinned_ahead_that_fails_to_decode_raises_at_its_turn_and_the_loop_goes_on() -> (
    None
):
    def setup(pool: FakePool) -> None:
        slow_first_worker(pool)
        pool.undecodable.add(1)

    it = _iterator(loader(Numbers(8), in_order=True), setup, Recorder())
    assert list(next(it)) == [0, 1]
    with pytest.raises(LookupError, match="cannot be rebuilt here") as raised:
        next(it)
    context = raised.value.conveyor_context  # type: ignore[attr-defined]
    assert (context.stage, context.indices, context.seq) == ("decode", (2, 3), 1)
    assert flat(list(it)) == [4, 5, 6, 7]


def test_a_failed_pin_is_raised_for_its_batch_and_closes_the_iterator_as_before() -> None:
    it = _iterator(loader(Numbers(8), in_order=True), slow_first_worker, Recorder(fail_at=2))
    assert list(next(it)) == [0, 1]
    with pytest.raises(RuntimeError, match="batch starting at 2"):
        next(it)
    assert it.closed and list(it) == []
    assert pin_threads_alive() == []


def test_a_new_epoch_drops_the_batch_pinned_ahead_and_gives_back_the_others() -> None:
    data = loader(Numbers(16), in_order=True, persistent_workers=True)
    it = _iterator(data, slow_first_worker, Recorder())
    pool = FakePool.instances[-1]
    next(it)
    arrived = [e for e in it._book.view.entries() if getattr(e.reply, "payload", None)]
    assert len(arrived) >= 2  # the one pinned ahead and at least one more
    it.reset()  # a break, then a new epoch on the same workers
    # The one pinned ahead was decoded already: only the others are given back.
    assert pool.discarded == len(arrived) - 1
    assert flat(list(it)) == list(range(16))


def test_the_accelerator_is_asked_for_only_once_a_batch_was_handed_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Asking which device is current initialises it; a fork after that breaks CUDA in
    # the workers, so it must wait until they run.
    from conveyor._iter import multiprocess

    asked: list[str] = []
    monkeypatch.setattr(multiprocess, "pinning_enabled", lambda config: True)
    monkeypatch.setattr(multiprocess, "pin_batch", Recorder())
    monkeypatch.setattr(multiprocess, "pin_thread_setup", lambda: asked.append("device"))
    it, _ = run(loader(Numbers(16), in_order=True), slow_first_worker)
    assert asked == []  # the workers are running and nothing asked yet
    next(it)
    assert asked == ["device"]  # by the pin thread's start, after the first batch
    assert flat(list(it)) == list(range(2, 16))


def test_the_pin_thread_stops_when_a_persistent_epoch_ends() -> None:
    # Between epochs nothing is pinned: a thread left idle would make another loader's
    # fork (a validation loader's workers) the fork of a multi-threaded process.
    data = loader(Numbers(16), in_order=True, persistent_workers=True)
    it = _iterator(data, slow_first_worker, Recorder())
    assert flat(list(it)) == list(range(16))
    assert not it.closed and pin_threads_alive() == []
    it.reset()
    batches = list(it)
    assert flat(batches) == list(range(16))
    assert {b.thread for b in batches} >= {THREAD_NAME}  # started again for the epoch
    assert pin_threads_alive() == []
    it.close()


def test_closing_mid_epoch_stops_the_pin_thread() -> None:
    it = _iterator(loader(Numbers(16), in_order=True), slow_first_worker, Recorder())
    next(it)
    assert pin_threads_alive()
    it.close()
    assert pin_threads_alive() == []
    assert FakePool.instances[-1].closed
