"""Deadlines, moment by moment: the time and the status pages in, what is overdue out.
A query changes nothing; the loop's answers (reported, give up, kill) are applied as
the loop applies them."""

from __future__ import annotations

import pytest
from tests.helpers.tables import Restarted, batches, died, dispatch, loop, step_kinds

from conveyor._iter.deadlines import STARTUP_LIMIT_S
from conveyor._iter.facts import Stalled, TimedOut
from conveyor._iter.ledger import Entry
from conveyor._task.protocol import GONE, BatchDone, Busy, Stage, WorkerStatus
from conveyor.errors import WorkerTimeoutError


def busy(worker: int, seq: int, age: float) -> Busy:
    return Busy(worker, 4000 + worker, WorkerStatus(0, seq, Stage.FETCH, -1, age))


def idle(worker: int, for_s: float) -> Busy:
    return Busy(worker, 4000 + worker, WorkerStatus(0, -1, None, -1, for_s))


def test_a_worker_frozen_before_starting_its_task_is_reported_as_a_stall() -> None:
    world = loop(stall_warning=2.0)
    dispatch(world.book, batches(2))  # worker 1 holds batch 1 and sits idle: frozen (SIGSTOP)
    assert world.overdue(1.0, [busy(0, 0, 1.0), idle(1, 1.0)]) == []
    [stall] = world.overdue(2.5, [busy(0, 0, 1.0), idle(1, 2.5)])
    assert isinstance(stall, Stalled) and (stall.worker_id, stall.seq) == (1, 1)
    assert "has batch 1 (dataset indices [2, 3]) waiting for it, but it has not started" in (
        stall.report
    )
    assert world.overdue(9.0, [busy(0, 0, 1.0), idle(1, 9.0)]) == []  # once


def test_an_idle_worker_without_a_task_is_not_stalled() -> None:
    world = loop(stall_warning=2.0)
    dispatch(world.book, batches(1))  # only worker 0 has a task
    assert world.overdue(50.0, [busy(0, 0, 1.0), idle(1, 50.0)]) == []


def test_a_query_changes_nothing() -> None:
    world = loop(timeout=5, stall_warning=2.0)
    dispatch(world.book, batches(4))
    workers = [busy(0, 0, 3.0)]
    first = world.deadlines.overdue(3.0, workers)
    assert first == world.deadlines.overdue(3.0, workers)  # not reported: reported again
    assert [type(x) for x in first] == [Stalled]
    for _ in range(2):
        [stuck] = world.deadlines.overdue(9.0, [busy(0, 0, 9.0)])
        assert isinstance(stuck, TimedOut) and stuck.place == 0
    assert world.book.view.fatal is None  # a timeout is placed by the loop, not by the query
    assert world.book.next_worker() is not None


def test_timeout_means_no_batch_for_that_long_even_if_nothing_runs() -> None:
    world = loop(timeout=5)
    b, deadlines = world.book, world.deadlines
    dispatch(b, batches(2))
    b.on_reply(0, BatchDone(0, 0, object()), now=1.0)
    assert isinstance(b.next_step(), Entry)
    # Batch 1's worker is frozen while idle: its status page shows no task running.
    assert deadlines.next_deadline(4.0, [idle(0, 3.0), idle(1, 3.0)]) == pytest.approx(2.0)
    assert world.overdue(5.9, [idle(0, 4.9), idle(1, 4.9)]) == []
    [timed_out] = world.overdue(6.0, [idle(0, 5.0), idle(1, 5.5)])
    assert isinstance(timed_out, TimedOut) and timed_out.worker_id == 1
    assert isinstance(timed_out.error, WorkerTimeoutError) and timed_out.place == 1
    text = str(timed_out.error)
    assert "DataLoader timed out after 5 seconds: worker 1 (pid 4001) has batch 1" in text
    assert "has not started it: it has been idle for 5.5 s" in text
    assert step_kinds(b, 1) == ["GiveUp"]


def test_timeout_counts_from_when_the_user_asks_not_from_the_last_batch() -> None:
    world = loop(timeout=5)
    b = world.book
    dispatch(b, batches(2))
    b.on_reply(0, BatchDone(0, 0, object()), now=1.0)
    b.next_step()
    world.deadlines.count_from(30.0)  # a 29 s training step: not the workers' fault
    assert world.overdue(34.0, [busy(1, 1, 3.0), idle(0, 33.0)]) == []
    assert isinstance(world.overdue(35.0, [busy(1, 1, 4.0), idle(0, 34.0)])[0], TimedOut)


def test_typical_batch_time_is_the_workers_own_not_the_consumers_pace() -> None:
    world = loop(stall_warning=0.5)
    dispatch(world.book, batches(4))
    for seq in range(4):
        world.reply(seq, busy_s=0.01)  # 10 ms in the worker, however slowly the user consumes
    assert world.book.view.batch_time == pytest.approx(0.01)
    assert world.deadlines.stall_threshold() == 0.5  # not 10x a consumer's 400 ms step


def test_a_stall_is_reported_once_per_send_with_the_typical_time() -> None:
    world = loop(stall_warning=2.0, max_worker_restarts=5)
    dispatch(world.book, batches(2))
    world.reply(1, busy_s=0.02)
    assert world.overdue(0.0, [busy(0, 0, 1.0)]) == []
    first = world.overdue(0.0, [busy(0, 0, 2.5)])
    assert [type(x) for x in first] == [Stalled]
    assert "a worker usually takes 20 ms per batch" in first[0].report  # type: ignore[union-attr]
    assert world.overdue(0.0, [busy(0, 0, 9.0)]) == []  # once per task...
    assert isinstance(world.die(died(0, 1, Stage.STARTUP), 1.0), Restarted)
    assert len(world.overdue(2.0, [busy(0, 0, 2.5)])) == 1  # ...and each time it is sent


def test_timeout_raise_gives_up_at_the_stuck_tasks_place() -> None:
    world = loop(timeout=5)
    dispatch(world.book, batches(4))
    world.reply(0, busy_s=0.03)
    [timed_out] = world.overdue(0.0, [busy(1, 1, 6.0)])
    assert isinstance(timed_out, TimedOut) and isinstance(timed_out.error, WorkerTimeoutError)
    assert timed_out.reason is None
    assert "usually takes 30 ms" in str(timed_out.error)
    assert step_kinds(world.book, 2) == [0, "GiveUp"]


def test_timeout_restart_kills_and_the_death_restarts_it_naming_the_reason() -> None:
    world = loop(timeout=5, on_timeout="restart")
    dispatch(world.book, batches(4))
    [timed_out] = world.deadlines.overdue(0.0, [busy(1, 1, 6.0)])
    assert isinstance(timed_out, TimedOut) and timed_out.error is None
    world.act([timed_out], stacks="  File 'x.py', line 3")
    decision = world.die(died(1, 1), 7.0)
    assert isinstance(decision, Restarted)
    assert "past timeout=5, so conveyor killed it" in decision.report
    assert "File 'x.py', line 3" in decision.report
    assert [t.seq for t in decision.resend] == [1, 3]
    # The replacement gets a whole timeout.
    assert world.deadlines.next_deadline(7.0, []) == 5


def test_deadline_is_the_nearest_limit_of_any_running_task() -> None:
    world = loop(timeout=10, stall_warning=4.0)
    deadlines = world.deadlines
    assert deadlines.next_deadline(0.0, []) == 4.0  # nothing sent: no batch is waited for
    assert deadlines.next_deadline(0.0, [busy(0, 0, 3.0), busy(1, 1, 1.0)]) == pytest.approx(1.0)
    assert deadlines.next_deadline(0.0, [busy(0, 0, 12.0)]) == 0.0


def test_no_limit_no_deadline() -> None:
    world = loop(stall_warning=None)
    assert not world.deadlines.watching
    assert world.deadlines.next_deadline(0.0, [busy(0, 0, 1e6)]) is None
    assert world.deadlines.overdue(1e6, [busy(0, 0, 1e6)]) == []


def test_of_several_stuck_tasks_the_one_the_loop_waits_for_times_out_first() -> None:
    """Batch 3 has been stuck longer, but the loop waits for batch 2: its error is the one
    to raise now (batch 3's would wait behind batch 2 for ever)."""
    world = loop(workers=4, prefetch=1, timeout=5)
    dispatch(world.book, batches(4))
    world.reply(0)
    world.reply(1)
    assert step_kinds(world.book, 3) == [0, 1, "Wait"]
    [timed_out] = world.overdue(10.0, [busy(2, 2, 5.5), busy(3, 3, 9.0)])
    assert isinstance(timed_out, TimedOut) and (timed_out.worker_id, timed_out.place) == (2, 2)
    assert step_kinds(world.book, 1) == ["GiveUp"]


def test_a_stuck_worker_that_was_ended_is_not_timed_out_again() -> None:
    """Killed or abandoned, it reads as gone until replaced: no second verdict, and the
    loop's wait is bounded by the others only (no busy loop)."""
    world = loop(workers=2, timeout=5)
    dispatch(world.book, batches(3))  # worker 0 holds batches 0 and 2, worker 1 batch 1
    world.reply(0)
    assert step_kinds(world.book, 1) == [0]
    world.deadlines.count_from(5.0)  # the user asked for batch 1 then
    [first] = world.overdue(6.0, [busy(0, 2, 6.0), busy(1, 1, 1.0)])
    assert first.worker_id == 0
    gone = Busy(0, 4000, GONE)
    assert world.overdue(7.0, [gone, busy(1, 1, 2.0)]) == []
    assert world.deadlines.next_deadline(7.0, [gone, busy(1, 1, 2.0)]) == pytest.approx(3.0)


def test_a_killed_holder_of_the_awaited_batch_is_not_timed_out_again_before_its_death() -> None:
    """A Ray actor's death may be heard many seconds after the kill (a loaded cluster):
    until then no batch comes, yet the worker already ended is not ended again, and
    no second verdict reads it as a worker that has "not started" its task."""
    world = loop(workers=2, timeout=5, on_timeout="restart")
    dispatch(world.book, batches(2))
    assert step_kinds(world.book, 1) == ["Wait"]  # for batch 0, worker 0's
    [first] = world.overdue(6.0, [busy(0, 0, 6.0), busy(1, 1, 1.0)])
    assert isinstance(first, TimedOut) and first.worker_id == 0 and first.reason is not None
    gone = Busy(0, 4000, GONE)
    for now in (7.0, 12.0, 30.0):  # its death not heard yet
        assert world.overdue(now, [gone, busy(1, 1, 1.0)]) == []
        assert world.deadlines.next_deadline(now, [gone, idle(1, 1.0)]) == 5


def test_past_the_cap_on_abandoned_threads_a_timeout_raises_saying_why() -> None:
    world = loop(timeout=5, on_timeout="restart")
    world.deadlines.ends_stuck = "abandoned"
    dispatch(world.book, batches(2))
    [restart] = world.deadlines.overdue(6.0, [busy(0, 0, 6.0)])
    assert isinstance(restart, TimedOut) and restart.reason is not None
    assert "so conveyor abandoned it (a thread cannot be killed" in restart.reason
    world.deadlines.no_replacement = "16 abandoned threads are still stuck."
    [raised] = world.deadlines.overdue(6.0, [busy(0, 0, 6.0)])
    assert isinstance(raised, TimedOut) and raised.reason is None and raised.error is not None
    assert str(raised.error).endswith("It was not replaced: 16 abandoned threads are still stuck.")


def starting(worker: int, for_s: float) -> Busy:
    return Busy(worker, 4000 + worker, WorkerStatus(-1, -1, Stage.STARTUP, -1, for_s))


def test_with_restart_a_slow_start_is_judged_by_the_startup_limit_not_by_timeout() -> None:
    """A replacement placed slowly by its cluster holds the batch the loop waits for: it
    is not killed at ``timeout`` (another would start as slowly), but past the start-up
    limit a start-up hung for good still is."""
    world = loop(timeout=5, on_timeout="restart")
    dispatch(world.book, batches(2))
    world.reply(0)
    assert step_kinds(world.book, 1) == [0]  # the loop now waits for batch 1, worker 1's
    workers = [idle(0, 40.0), starting(1, 40.0)]
    assert world.deadlines.overdue(40.0, workers) == []
    # No busy loop: the wait is bounded by a limit a task sent later could reach first.
    assert world.deadlines.next_deadline(40.0, workers) == 5
    [stuck] = world.deadlines.overdue(400.0, [idle(0, 400.0), starting(1, STARTUP_LIMIT_S)])
    assert isinstance(stuck, TimedOut) and stuck.worker_id == 1 and stuck.error is None


def test_with_restart_a_worker_that_started_slowly_gets_a_whole_timeout_for_its_task() -> None:
    """Its start-up took longer than ``timeout`` (allowed): as it begins the awaited
    batch it is not killed for the quiet of its own start, only once the task itself
    runs past ``timeout``."""
    world = loop(timeout=5, on_timeout="restart")
    dispatch(world.book, batches(2))
    assert step_kinds(world.book, 1) == ["Wait"]  # for batch 0, worker 0's
    assert world.overdue(40.0, [starting(0, 40.0), idle(1, 40.0)]) == []
    world.deadlines.started(40.0)  # worker 0's Ready
    assert world.overdue(40.5, [busy(0, 0, 0.5), idle(1, 40.5)]) == []
    assert world.deadlines.next_deadline(40.5, [busy(0, 0, 0.5), idle(1, 40.5)]) == 4.5
    [stuck] = world.overdue(45.5, [busy(0, 0, 5.5), idle(1, 45.5)])
    assert isinstance(stuck, TimedOut) and stuck.worker_id == 0
    assert stuck.reason == "stuck (fetch) past timeout=5, so conveyor killed it"


def test_with_raise_a_slow_start_times_out_as_in_torch() -> None:
    world = loop(timeout=5)
    dispatch(world.book, batches(2))
    world.reply(0)
    assert step_kinds(world.book, 1) == [0]
    [timed_out] = world.overdue(6.0, [idle(0, 6.0), starting(1, 6.0)])
    assert isinstance(timed_out, TimedOut) and isinstance(timed_out.error, WorkerTimeoutError)
