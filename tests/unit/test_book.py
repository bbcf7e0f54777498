"""The task book, event by event: facts in, decisions out. No process, no clock, no sleep."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor._iter.book import (
    Busy,
    EpochEnd,
    GiveUp,
    Handout,
    Restart,
    Stalled,
    TaskBook,
    TimedOut,
    Wait,
)
from conveyor._workers.events import Died
from conveyor._workers.protocol import BatchDone, IterationEnded, SampleFailed, Stage, TaskFailed
from conveyor._workers.remote_error import capture
from conveyor._workers.status import WorkerStatus
from conveyor.config import SupervisionPolicy
from conveyor.errors import WorkerCrashedError, WorkerTimeoutError
from conveyor.records import SkippedSample

IDLE = WorkerStatus(-1, -1, None, -1, 0.0)
DONE = object()  # a batch payload stand-in


def book(
    workers: int = 2, prefetch: int = 2, in_order: bool = True, **policy: Any
) -> tuple[TaskBook, list[SkippedSample]]:
    skipped: list[SkippedSample] = []
    timeout = policy.pop("timeout", 0)
    iterable = policy.pop("iterable", False)
    b = TaskBook(
        num_workers=workers,
        prefetch=prefetch,
        in_order=in_order,
        iterable=iterable,
        auto_collation=True,
        policy=SupervisionPolicy(**policy),
        skipped=skipped,
        timeout=timeout,
    )
    b.start_epoch(0, 100)
    return b, skipped


def dispatch(b: TaskBook, batches: list[list[int]]) -> list[tuple[int, int]]:
    """Send as many of ``batches`` as the book allows; (worker, seq) of each sent."""
    sent = []
    for index in batches:
        worker = b.next_worker()
        if worker is None:
            break
        task = b.add(worker, index, now=0.0)
        sent.append((worker, task.seq))
    return sent


def reply(b: TaskBook, seq: int, **kw: Any) -> bool:
    return b.on_reply(b.tasks[seq].worker_id, BatchDone(b.epoch, seq, DONE, **kw))


def step_kinds(b: TaskBook, n: int) -> list[Any]:
    out = []
    for _ in range(n):
        s = b.next_step()
        out.append(s.entry.seq if isinstance(s, Handout) else type(s).__name__)
        if not isinstance(s, Handout):
            break
    return out


def batches(n: int, size: int = 2) -> list[list[int]]:
    return [list(range(i * size, (i + 1) * size)) for i in range(n)]


# --- delivery ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("in_order", "arrivals", "expected"),
    [
        (True, [1, 0, 3, 2], [0, 1, 2, 3]),
        (True, [3, 2, 1], ["Wait"]),  # seq 0 missing: nothing can be handed out
        (False, [3, 1], [3, 1, "Wait"]),  # as they come
        (False, [2, 0, 1, 3], [2, 0, 1, 3]),
    ],
)
def test_delivery_order(in_order: bool, arrivals: list[int], expected: list[Any]) -> None:
    b, _ = book(in_order=in_order)
    assert dispatch(b, batches(4)) == [(0, 0), (1, 1), (0, 2), (1, 3)]
    for seq in arrivals:
        assert reply(b, seq)
    assert step_kinds(b, len(expected)) == expected


def test_epoch_ends_when_every_task_is_handed_out_and_the_sampler_is_done() -> None:
    b, _ = book()
    dispatch(b, batches(2))
    b.next_worker()
    b.sampler_ended()
    for seq in (0, 1):
        reply(b, seq)
    assert step_kinds(b, 3) == [0, 1, "EpochEnd"]


def test_capacity_out_of_order_routes_around_a_busy_worker() -> None:
    b, _ = book(workers=2, prefetch=1, in_order=False)
    assert dispatch(b, batches(2)) == [(0, 0), (1, 1)]
    reply(b, 1)
    assert isinstance(b.next_step(), Handout)  # worker 1's batch out: it has room again
    assert b.next_worker() == 1  # worker 0 is at capacity (its task still running)


def test_in_order_dispatch_waits_for_its_turn_like_torch() -> None:
    b, _ = book(workers=2, prefetch=1, in_order=True)
    dispatch(b, batches(2))
    reply(b, 1)
    assert b.next_worker() == 0  # round-robin, whatever the load


def test_stale_and_repeated_replies_are_refused() -> None:
    b, _ = book()
    dispatch(b, batches(2))
    assert reply(b, 0)
    assert not reply(b, 0)  # the same task answered twice (a resent task's late twin)
    assert not b.on_reply(0, BatchDone(b.epoch - 1, 1, DONE))  # an abandoned epoch
    assert not b.on_reply(0, BatchDone(b.epoch, 99, DONE))  # never sent


def test_new_epoch_forgets_the_old_epochs_tasks() -> None:
    b, _ = book()
    dispatch(b, batches(4))
    reply(b, 0)
    b.start_epoch(1, 100)  # persistent workers, the user broke out of epoch 0
    assert b.tasks == {}
    assert not b.on_reply(0, BatchDone(0, 1, DONE))  # epoch 0's replies are stale now
    assert dispatch(b, batches(1)) == [(0, 0)]
    assert b.epoch == 1


def test_an_iterable_workers_end_makes_it_inactive() -> None:
    b, _ = book(iterable=True)
    dispatch(b, batches(4))
    b.on_reply(0, IterationEnded(0, 0))
    assert isinstance(b.next_step(), Handout)
    assert [b.next_worker() for _ in range(3)] == [1, 1, 1]


# --- dead workers -------------------------------------------------------------------


SIGKILL, SIGSEGV, EXIT3 = -9, -11, 3  # exit codes: killed from outside, crashes of its own


def died(
    worker: int, seq: int, stage: Stage = Stage.FETCH, position: int = -1, code: int = SIGSEGV
) -> Died:
    return Died(worker, 4000 + worker, code, WorkerStatus(0, seq, stage, position, 0.1))


def test_a_dead_workers_unanswered_tasks_are_resent_to_its_replacement() -> None:
    b, _ = book()
    dispatch(b, batches(4))  # worker 0 holds 0 and 2
    reply(b, 0)
    decision = b.on_death(died(0, 2), now=1.0)
    assert isinstance(decision, Restart)
    assert [(t.seq, t.index, t.trace) for t in decision.resend] == [(2, [4, 5], True)]
    assert "exited unexpectedly during fetch of batch 2" in decision.report
    assert "SIGSEGV" in decision.report
    assert (b.restarts, b.retried) == (1, 1)


def probe_died(worker: int, seq: int, code: int = SIGSEGV, stage: Stage = Stage.FETCH) -> Died:
    """The death of a worker trying a suspect alone: a one-sample task, position 0."""
    return died(worker, seq, stage, position=0, code=code)


def test_a_sample_named_by_a_death_is_tried_alone_in_a_fresh_worker_first() -> None:
    b, _ = book()
    dispatch(b, batches(4))  # worker 0 holds 0 ([0, 1]) and 2 ([4, 5])
    assert isinstance(b.on_death(died(0, 0), 1.0), Restart)
    decision = b.on_death(died(0, 0, position=1), 2.0)  # the traced retry: index 1
    assert isinstance(decision, Restart)
    # The suspect alone comes first; then the task itself (traced) and the others.
    assert [(t.seq, t.index, t.trace, t.first_sample) for t in decision.resend] == [
        (0, [1], True, 1),
        (0, [0, 1], True, 0),
        (2, [4, 5], False, 0),
    ]
    assert "at dataset index 1: killed by signal SIGSEGV" in decision.report
    assert "re-sent its 2 unanswered task(s), after trying dataset index 1 alone" in (
        decision.report
    )
    assert (b.restarts, b.charged, b.retried) == (2, 2, 4)  # [0, 1] and [4, 5] twice


def test_a_sample_that_kills_a_fresh_worker_alone_too_gives_up_at_its_place() -> None:
    b, _ = book()
    dispatch(b, batches(4))
    b.on_death(died(0, 0), 1.0)
    b.on_death(died(0, 0, position=1), 2.0)
    assert b.on_death(probe_died(0, 0), 3.0) is None
    reply(b, 1)
    step = b.next_step()
    assert isinstance(step, GiveUp)  # at seq 0: nothing earlier to deliver
    assert isinstance(step.error, WorkerCrashedError)
    text = str(step.error)
    assert "at dataset index 1 (tried alone in a fresh worker)" in text
    assert "Dataset index 1 killed its worker 3 times, the last time alone in a fresh worker" in (
        text
    )


def test_a_suspect_that_survives_alone_is_cleared_and_its_task_answered_as_usual() -> None:
    b, skipped = book(on_error="skip", max_errors=3)
    dispatch(b, batches(4))
    b.on_death(died(0, 0), 1.0)
    b.on_death(died(0, 0, position=1), 2.0)
    # The probe's reply is only a verdict: refused, its payload freed by the loop.
    assert not reply(b, 0)
    assert reply(b, 0)  # the task itself, whole
    assert step_kinds(b, 1) == [0]
    assert 0 not in b.tasks
    assert skipped == []


def test_after_a_cleared_suspect_the_evidence_starts_again() -> None:
    b, _ = book(max_worker_restarts=10)
    dispatch(b, batches(4))
    b.on_death(died(0, 0), 1.0)
    b.on_death(died(0, 0, position=1), 2.0)
    assert not reply(b, 0)  # survived alone
    # Its batch kills the worker at index 1 again (memory the samples before it leaked,
    # say): a suspect again, tried alone again, not accused.
    decision = b.on_death(died(0, 0, position=1), 3.0)
    assert isinstance(decision, Restart)
    assert [t.index for t in decision.resend[:2]] == [[1], [0, 1]]


def test_a_probe_lost_with_a_worker_dying_at_start_up_is_tried_again_first() -> None:
    b, _ = book(max_worker_restarts=10)
    dispatch(b, batches(4))
    b.on_death(died(0, 0), 1.0)
    b.on_death(died(0, 0, position=1), 2.0)
    decision = b.on_death(died(0, -1, Stage.STARTUP, code=SIGKILL), 3.0)
    assert isinstance(decision, Restart)
    assert [(t.seq, t.index) for t in decision.resend] == [(0, [1]), (0, [0, 1]), (2, [4, 5])]
    assert b.on_death(probe_died(0, 0), 4.0) is None  # the probe's death still counts


FETCH, TRACED, ALONE, COLLATE = "fetch", "traced", "alone", "collate"
SURVIVES = ("survives", 0)  # the suspect's probe answers


def _event(b: TaskBook, what: tuple[str, int], now: float) -> Restart | bool | None:
    where, code = what
    if what == SURVIVES:
        return reply(b, 0)
    if where == ALONE:
        return b.on_death(probe_died(0, 0, code), now)
    if where == COLLATE:
        return b.on_death(died(0, 0, Stage.COLLATE, code=code), now)
    return b.on_death(died(0, 0, position=1 if where == TRACED else -1, code=code), now)


@pytest.mark.parametrize(
    ("events", "poison"),
    [
        # A death of its own, in the batch, then at index 1, then index 1 alone: proof.
        ([(FETCH, SIGSEGV), (TRACED, SIGSEGV), (ALONE, SIGSEGV)], True),
        ([(FETCH, SIGSEGV), (TRACED, SIGSEGV)], False),  # not yet tried alone
        # Three kills from outside at the same sample, the last alone: not enough.
        ([(FETCH, SIGKILL), (TRACED, SIGKILL), (ALONE, SIGKILL)], False),
        # Killed alone in two fresh workers: the bar for SIGKILL.
        ([(FETCH, SIGKILL), (TRACED, SIGKILL), (ALONE, SIGKILL), (ALONE, SIGKILL)], True),
        # Alone, it survived: cleared; killed at it again, it must be proven again.
        (
            [(FETCH, SIGKILL), (TRACED, SIGKILL), SURVIVES, (TRACED, SIGKILL), (ALONE, SIGKILL)],
            False,
        ),
        # A death of another kind alone is not the same evidence: it starts again.
        ([(FETCH, SIGSEGV), (TRACED, SIGSEGV), (ALONE, EXIT3)], False),
        ([(FETCH, SIGSEGV), (TRACED, SIGSEGV), (ALONE, EXIT3), (ALONE, EXIT3)], True),
        ([(FETCH, SIGSEGV), (TRACED, SIGKILL), (ALONE, SIGSEGV)], False),
        ([(FETCH, SIGKILL), (TRACED, SIGSEGV), (ALONE, SIGSEGV)], True),
        # Outside fetching no sample is named: the batch, by deaths in a row of one kind.
        ([(COLLATE, SIGSEGV), (COLLATE, SIGSEGV)], True),
        ([(COLLATE, SIGKILL), (COLLATE, SIGKILL)], False),
        ([(COLLATE, SIGKILL), (COLLATE, SIGKILL), (COLLATE, SIGKILL)], True),
        (
            [
                *[(COLLATE, SIGKILL), (TRACED, SIGKILL), SURVIVES],
                *[(COLLATE, SIGKILL), (COLLATE, SIGKILL)],
            ],
            False,
        ),
    ],
)
def test_evidence_needed_to_call_a_sample_poison(
    events: list[tuple[str, int]], poison: bool
) -> None:
    b, _ = book(max_worker_restarts=10)
    dispatch(b, batches(4))
    outcomes = [_event(b, event, float(i)) for i, event in enumerate(events)]
    deaths = [o for e, o in zip(events, outcomes, strict=True) if e != SURVIVES]
    assert all(isinstance(d, Restart) for d in deaths[:-1])
    assert (deaths[-1] is None) == poison
    if poison:
        step = b.next_step()
        assert isinstance(step, GiveUp)
        batch = events[-1][0] == COLLATE
        who = "This batch" if batch else "Dataset index 1"
        assert f"{who} killed its worker" in str(step.error)


@pytest.mark.parametrize(
    ("codes", "poison"),
    [
        ([SIGSEGV, SIGSEGV], True),  # the task is the sample: its retry is the probe
        ([SIGKILL, SIGKILL], False),
        ([SIGKILL, SIGKILL, SIGKILL], True),
    ],
)
def test_a_one_sample_batch_is_its_own_probe(codes: list[int], poison: bool) -> None:
    b, _ = book(max_worker_restarts=10)
    dispatch(b, batches(4, size=1))
    decisions = [b.on_death(died(0, 0, code=c), float(i)) for i, c in enumerate(codes)]
    assert all(isinstance(d, Restart) for d in decisions[:-1])
    first = decisions[0]
    assert isinstance(first, Restart)
    assert [(t.seq, t.index, t.trace) for t in first.resend] == [(0, [0], True), (2, [2], False)]
    assert "after trying dataset index 0 alone" in first.report
    assert (decisions[-1] is None) == poison


def test_under_skip_the_poison_sample_is_left_out_and_the_task_retried_without_it() -> None:
    b, skipped = book(on_error="skip", max_errors=3)
    dispatch(b, batches(4))
    b.on_death(died(0, 0), 1.0)
    b.on_death(died(0, 0, position=1), 2.0)
    decision = b.on_death(probe_died(0, 0), 3.0)
    assert isinstance(decision, Restart)
    assert [(t.seq, t.index, t.exclude) for t in decision.resend] == [
        (0, [0, 1], (1,)),
        (2, [4, 5], ()),
    ]
    reply(b, 0)
    assert isinstance(b.next_step(), Handout)
    assert [(s.index, s.stage) for s in skipped] == [(1, "crash")]  # recorded when handed out
    assert skipped[0].message.startswith("killed its worker 3 times: killed by signal SIGSEGV")
    # Later tasks leave it out up front.
    b.start_epoch(1, 100)
    sent = b.add(0, [0, 1], now=3.0)
    assert sent.exclude == (1,)


def test_a_sample_proven_by_kills_from_outside_is_tried_again_next_epoch() -> None:
    b, skipped = book(on_error="skip", max_errors=3, max_worker_restarts=10)
    dispatch(b, batches(4))
    b.on_death(died(0, 0, code=SIGKILL), 1.0)
    b.on_death(died(0, 0, position=1, code=SIGKILL), 2.0)
    b.on_death(probe_died(0, 0, SIGKILL), 3.0)
    decision = b.on_death(probe_died(0, 0, SIGKILL), 4.0)
    assert isinstance(decision, Restart) and decision.resend[0].exclude == (1,)
    reply(b, 0)
    b.next_step()
    assert [(s.index, s.stage) for s in skipped] == [(1, "killed")]
    b.start_epoch(1, 100)
    assert b.add(0, [0, 1], now=9.0).exclude == ()  # memory pressure may pass: tried again


def test_deaths_a_sample_is_proven_to_cause_are_not_charged_to_the_restart_budget() -> None:
    # The default budget (3) is smaller than the four deaths that prove a SIGKILL sample.
    b, _ = book(on_error="skip", max_errors=3)
    dispatch(b, batches(4))
    for event in [died(0, 0, code=SIGKILL), died(0, 0, position=1, code=SIGKILL)]:
        assert isinstance(b.on_death(event, 1.0), Restart)
    assert isinstance(b.on_death(probe_died(0, 0, SIGKILL), 2.0), Restart)
    assert b.charged == 3
    decision = b.on_death(probe_died(0, 0, SIGKILL), 3.0)
    assert isinstance(decision, Restart)
    assert "not counted against max_worker_restarts" in decision.report
    assert (b.restarts, b.charged) == (4, 0)
    # Another death, of no sample's doing, has the whole budget again.
    decision = b.on_death(died(1, 1, code=SIGKILL), 4.0)
    assert isinstance(decision, Restart) and "(restart 1 of 3)" in decision.report


def test_restart_budget_spent_gives_up_after_earlier_batches() -> None:
    b, _ = book(max_worker_restarts=0)
    dispatch(b, batches(4))  # worker 1 holds 1 and 3
    assert b.on_death(died(1, 1), 1.0) is None
    assert isinstance(b.next_step(), Wait)  # batch 0 is still coming from worker 0
    reply(b, 0)
    assert isinstance(b.next_step(), Handout)
    step = b.next_step()
    assert isinstance(step, GiveUp) and "restart budget is spent" in str(step.error)
    assert b.next_worker() is None  # nothing more is sent once giving up


def test_outside_kills_during_start_up_are_bounded_by_the_restart_budget_only() -> None:
    b, _ = book(max_worker_restarts=3)
    dispatch(b, batches(2))
    for i in range(3):
        decision = b.on_death(died(0, -1, Stage.STARTUP, code=SIGKILL), float(i))
        assert isinstance(decision, Restart)
    assert b.on_death(died(0, -1, Stage.STARTUP, code=SIGKILL), 4.0) is None
    step = b.next_step()
    assert isinstance(step, GiveUp) and "restart budget is spent" in str(step.error)


def test_two_start_up_deaths_in_a_row_give_up_and_a_ready_worker_resets_the_run() -> None:
    b, _ = book(max_worker_restarts=10)
    dispatch(b, batches(2))
    assert isinstance(b.on_death(died(0, -1, Stage.STARTUP), 1.0), Restart)
    b.on_ready(0)
    assert isinstance(b.on_death(died(0, -1, Stage.STARTUP), 2.0), Restart)
    assert b.on_death(died(0, -1, Stage.WORKER_INIT), 3.0) is None
    step = b.next_step()
    assert isinstance(step, GiveUp) and "died the same way in its replacement" in str(step.error)


# --- skips --------------------------------------------------------------------------


def failed_sample(index: int) -> SampleFailed:
    return SampleFailed(index, Stage.FETCH, capture(ValueError(f"bad {index}")))


def test_skip_budget_is_judged_in_delivery_order() -> None:
    b, skipped = book(on_error="skip", max_errors=0)
    dispatch(b, batches(4))
    reply(b, 1, skipped=(failed_sample(2),))  # arrives first, but comes second
    reply(b, 0)
    assert step_kinds(b, 1) == [0]  # the earlier batch is delivered first
    step = b.next_step()
    assert isinstance(step, GiveUp) and isinstance(step.error, ValueError)
    assert "max_errors=0" in step.error.__notes__[-1]
    assert [s.index for s in skipped] == [2]


def test_skipped_samples_within_budget_are_recorded_with_their_epoch_and_stage() -> None:
    b, skipped = book(on_error="skip", max_errors=2)
    dispatch(b, batches(2))
    reply(b, 0, skipped=(failed_sample(1),))
    b.next_step()
    assert [(s.index, s.epoch, s.worker_id, s.stage, s.exception_type) for s in skipped] == [
        (1, 0, 0, "fetch", "builtins.ValueError")
    ]


# --- time ---------------------------------------------------------------------------


def busy(worker: int, seq: int, age: float) -> Busy:
    return Busy(worker, 4000 + worker, WorkerStatus(0, seq, Stage.FETCH, -1, age))


def idle(worker: int, for_s: float) -> Busy:
    return Busy(worker, 4000 + worker, WorkerStatus(0, -1, None, -1, for_s))


def test_a_worker_frozen_before_starting_its_task_is_reported_as_a_stall() -> None:
    b, _ = book(stall_warning=2.0)
    dispatch(b, batches(2))  # worker 1 holds batch 1 and sits idle: frozen (SIGSTOP)
    assert b.overdue(1.0, [busy(0, 0, 1.0), idle(1, 1.0)]) == []
    [stall] = b.overdue(2.5, [busy(0, 0, 1.0), idle(1, 2.5)])
    assert isinstance(stall, Stalled) and (stall.worker_id, stall.seq) == (1, 1)
    assert "has batch 1 (dataset indices [2, 3]) waiting for it, but it has not started" in (
        stall.report
    )
    assert b.overdue(9.0, [busy(0, 0, 1.0), idle(1, 9.0)]) == []  # once


def test_an_idle_worker_without_a_task_is_not_stalled() -> None:
    b, _ = book(stall_warning=2.0)
    dispatch(b, batches(1))  # only worker 0 has a task
    assert b.overdue(50.0, [busy(0, 0, 1.0), idle(1, 50.0)]) == []


def test_timeout_means_no_batch_for_that_long_even_if_nothing_runs() -> None:
    b, _ = book(timeout=5)
    dispatch(b, batches(2))
    b.on_reply(0, BatchDone(0, 0, DONE), now=1.0)
    assert isinstance(b.next_step(), Handout)
    # Batch 1's worker is frozen while idle: its status page shows no task running.
    assert b.next_deadline(4.0, [idle(0, 3.0), idle(1, 3.0)]) == pytest.approx(2.0)  # 1 + 5 - 4
    assert b.overdue(5.9, [idle(0, 4.9), idle(1, 4.9)]) == []
    [timed_out] = b.overdue(6.0, [idle(0, 5.0), idle(1, 5.5)])
    assert isinstance(timed_out, TimedOut) and timed_out.worker_id == 1
    assert isinstance(timed_out.error, WorkerTimeoutError)
    text = str(timed_out.error)
    assert "DataLoader timed out after 5 seconds: worker 1 (pid 4001) has batch 1" in text
    assert "has not started it: it has been idle for 5.5 s" in text
    assert step_kinds(b, 1) == ["GiveUp"]


def test_timeout_counts_from_when_the_user_asks_not_from_the_last_batch() -> None:
    b, _ = book(timeout=5)
    dispatch(b, batches(2))
    b.on_reply(0, BatchDone(0, 0, DONE), now=1.0)
    b.next_step()
    b.user_waits(30.0)  # a 29 s training step: not the workers' fault
    assert b.overdue(34.0, [busy(1, 1, 3.0), idle(0, 33.0)]) == []
    assert isinstance(b.overdue(35.0, [busy(1, 1, 4.0), idle(0, 34.0)])[0], TimedOut)


def test_typical_batch_time_is_the_workers_own_not_the_consumers_pace() -> None:
    b, _ = book(stall_warning=0.5)
    dispatch(b, batches(4))
    for seq in range(4):
        reply(b, seq, busy_s=0.01)  # 10 ms in the worker, however slowly the user consumes
    assert b.batch_time == pytest.approx(0.01)
    assert b.stall_threshold() == 0.5  # not 10x a consumer's 400 ms step


def test_a_stall_is_reported_once_with_the_typical_time() -> None:
    b, _ = book(stall_warning=2.0)
    dispatch(b, batches(2))
    reply(b, 1, busy_s=0.02)
    assert b.overdue(0.0, [busy(0, 0, 1.0)]) == []
    first = b.overdue(0.0, [busy(0, 0, 2.5)])
    assert [type(x) for x in first] == [Stalled]
    assert "a worker usually takes 20 ms per batch" in first[0].report  # type: ignore[union-attr]
    assert b.overdue(0.0, [busy(0, 0, 9.0)]) == []  # once per task


def test_timeout_raise_gives_up_at_the_stuck_tasks_place() -> None:
    b, _ = book(timeout=5)
    dispatch(b, batches(4))
    reply(b, 0, busy_s=0.03)
    [timed_out] = b.overdue(0.0, [busy(1, 1, 6.0)])
    assert isinstance(timed_out, TimedOut) and isinstance(timed_out.error, WorkerTimeoutError)
    assert "usually takes 30 ms" in str(timed_out.error)
    assert step_kinds(b, 2) == [0, "GiveUp"]


def test_timeout_restart_kills_and_the_death_restarts_it_naming_the_reason() -> None:
    b, _ = book(timeout=5, on_timeout="restart")
    dispatch(b, batches(4))
    [timed_out] = b.overdue(0.0, [busy(1, 1, 6.0)])
    assert isinstance(timed_out, TimedOut) and timed_out.error is None
    b.add_to_kill_reason(1, "  File 'x.py', line 3")
    decision = b.on_death(died(1, 1), 7.0)
    assert isinstance(decision, Restart)
    assert "past timeout=5, so conveyor killed it" in decision.report
    assert "File 'x.py', line 3" in decision.report
    assert [t.seq for t in decision.resend] == [1, 3]


def test_deadline_is_the_nearest_limit_of_any_running_task() -> None:
    b, _ = book(timeout=10, stall_warning=4.0)
    assert b.next_deadline(0.0, []) == 4.0  # nothing sent: no batch is waited for
    assert b.next_deadline(0.0, [busy(0, 0, 3.0), busy(1, 1, 1.0)]) == pytest.approx(1.0)
    assert b.next_deadline(0.0, [busy(0, 0, 12.0)]) == 0.0


# --- failures in user code ----------------------------------------------------------


def test_task_failure_is_handed_out_in_order_with_its_context() -> None:
    b, _ = book()
    dispatch(b, batches(2))
    b.on_reply(1, TaskFailed(0, 1, Stage.COLLATE, capture(KeyError("label"))))
    reply(b, 0)
    assert step_kinds(b, 1) == [0]
    step = b.next_step()
    assert isinstance(step, Handout)
    context = b.task_error_context(step.entry, pid=77)
    assert (context.worker_id, context.pid, context.stage, context.indices) == (
        1,
        77,
        "collate",
        (2, 3),
    )


def test_nothing_is_handed_out_after_the_epoch_ends() -> None:
    b, _ = book(workers=1, prefetch=1)
    b.sampler_ended()
    assert isinstance(b.next_step(), EpochEnd)


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (SIGKILL, "DataLoader worker (pid 4000) is killed by signal: Killed."),
        (SIGSEGV, "DataLoader worker (pid 4000) is killed by signal: Segmentation fault."),
        (3, "DataLoader worker (pid(s) 4000) exited unexpectedly"),
    ],
)
def test_crash_reports_keep_torchs_words_for_log_alerts(code: int, words: str) -> None:
    b, _ = book()
    dispatch(b, batches(2))
    decision = b.on_death(died(0, 0, code=code), 1.0)
    assert isinstance(decision, Restart) and words in decision.report


@pytest.mark.parametrize("forked", [True, False])
def test_the_native_crash_hint_suggests_spawn_only_to_forked_workers(forked: bool) -> None:
    b, _ = book()
    b.forked = forked
    dispatch(b, batches(2))
    decision = b.on_death(died(0, 0, code=SIGSEGV), 1.0)
    assert isinstance(decision, Restart)
    assert ("multiprocessing_context='spawn'" in decision.report) == forked


def _top_up(b: TaskBook, first: int) -> list[tuple[int, int]]:
    """Send while the book wants tasks; (worker, seq) of each sent."""
    sent = []
    while b.wants_task():
        worker = b.next_worker()
        assert worker is not None
        sent.append((worker, b.add(worker, [first + len(sent)], now=0.0).seq))
    return sent


def test_run_ahead_lets_more_tasks_out_round_robin_then_one_per_hand_out() -> None:
    b, _ = book(workers=2, prefetch=2)
    assert len(_top_up(b, 0)) == 4  # torch's count: prefetch x workers
    b.allow_run_ahead(3)
    more = _top_up(b, 4)
    assert more == [(0, 4), (1, 5), (0, 6), (1, 7), (0, 8), (1, 9)]  # still round-robin
    reply(b, 0)
    assert not b.wants_task()  # a reply does not free a place: handing out does
    assert step_kinds(b, 1) == [0]
    assert len(_top_up(b, 10)) == 1


def test_each_epoch_starts_without_run_ahead() -> None:
    # After a break the last epoch's tasks are still out: the new epoch allows the
    # run-ahead again only once the loop says so (its batches have come).
    b, _ = book(workers=2, prefetch=1)
    b.allow_run_ahead(4)
    assert len(_top_up(b, 0)) == 10
    b.start_epoch(1, 100)
    assert b.run_ahead == 0
    assert len(_top_up(b, 0)) == 2


def test_no_task_is_wanted_once_the_sampler_ended_or_the_book_gave_up() -> None:
    b, _ = book(workers=1, prefetch=1)
    b.allow_run_ahead(5)
    b.sampler_ended()
    assert not b.wants_task()


def test_a_batchs_sample_count_comes_from_its_task_when_the_task_can_say() -> None:
    b, _ = book(on_error="skip")
    (_, plain), (w1, skipping) = dispatch(b, [[0, 1, 2], [3, 4, 5]])
    reply(b, plain)
    b.on_reply(w1, BatchDone(b.epoch, skipping, DONE, skipped=(failed_sample(4),)))
    assert b.tasks[plain].samples_in_batch() == 3
    assert b.tasks[skipping].samples_in_batch() is None  # only the batch knows: 2
    [(_, unanswered)] = dispatch(b, [[6, 7]])
    assert b.tasks[unanswered].samples_in_batch() is None
    iterable, _ = book(iterable=True)
    [(_, seq)] = dispatch(iterable, [[None, None]])
    reply(iterable, seq)
    assert iterable.tasks[seq].samples_in_batch() is None  # an iterable's batch may be short
