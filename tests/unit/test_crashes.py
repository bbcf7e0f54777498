"""The crash judge, death by death: who died holding what, and what is proven poison.
Facts in, decisions out, applied to the task book as the loop applies them."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.helpers.tables import (
    EXIT3,
    SIGKILL,
    SIGSEGV,
    Loop,
    Restarted,
    batches,
    died,
    dispatch,
    loop,
    probe_died,
    step_kinds,
)

from conveyor._iter.facts import GiveUpAt
from conveyor._iter.ledger import Entry
from conveyor._iter.messages import kill_reason
from conveyor._iter.steps import GiveUp, Wait
from conveyor._task.protocol import Bystander, Own, Stage, Unknown
from conveyor.errors import WorkerCrashedError


def test_a_dead_workers_unanswered_tasks_are_resent_to_its_replacement() -> None:
    world = loop()
    dispatch(world.book, batches(4))  # worker 0 holds 0 and 2
    world.reply(0)
    decision = world.die(died(0, 2), now=1.0)
    assert isinstance(decision, Restarted)
    assert [(t.seq, t.index, t.trace) for t in decision.resend] == [(2, [4, 5], True)]
    assert "exited unexpectedly during fetch of batch 2" in decision.report
    assert "SIGSEGV" in decision.report
    assert (world.tally.restarts, world.tally.retried) == (1, 1)
    assert world.book.view.entry(2).sent_at == 1.0


def test_a_sample_named_by_a_death_is_tried_alone_in_a_fresh_worker_first() -> None:
    world = loop()
    dispatch(world.book, batches(4))  # worker 0 holds 0 ([0, 1]) and 2 ([4, 5])
    assert isinstance(world.die(died(0, 0), 1.0), Restarted)
    decision = world.die(died(0, 0, position=1), 2.0)  # the traced retry: index 1
    assert isinstance(decision, Restarted)
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
    assert (world.tally.restarts, world.judge.charged, world.tally.retried) == (2, 2, 4)


def test_a_sample_that_kills_a_fresh_worker_alone_too_gives_up_at_its_place() -> None:
    world = loop()
    dispatch(world.book, batches(4))
    world.die(died(0, 0), 1.0)
    world.die(died(0, 0, position=1), 2.0)
    assert world.die(probe_died(0, 0), 3.0) is None
    world.reply(1)
    step = world.book.next_step()
    assert isinstance(step, GiveUp)  # at seq 0: nothing earlier to deliver
    assert isinstance(step.error, WorkerCrashedError)
    text = str(step.error)
    assert "at dataset index 1 (tried alone in a fresh worker)" in text
    assert "Dataset index 1 killed its worker 3 times, the last time alone in a fresh worker" in (
        text
    )


def test_a_suspect_that_survives_alone_is_cleared_and_its_task_answered_as_usual() -> None:
    world = loop(on_error="skip", max_errors=3)
    dispatch(world.book, batches(4))
    world.die(died(0, 0), 1.0)
    world.die(died(0, 0, position=1), 2.0)
    # The probe's reply is only a verdict: refused, its payload freed by the loop.
    assert not world.reply(0)
    assert world.reply(0)  # the task itself, whole
    assert step_kinds(world.book, 1) == [0]
    assert world.book.view.entry(0) is None
    assert world.skipped == []


def test_after_a_cleared_suspect_the_evidence_starts_again() -> None:
    world = loop(max_worker_restarts=10)
    dispatch(world.book, batches(4))
    world.die(died(0, 0), 1.0)
    world.die(died(0, 0, position=1), 2.0)
    assert not world.reply(0)  # survived alone
    # Its batch kills the worker at index 1 again (memory the samples before it leaked,
    # say): a suspect again, tried alone again, not accused.
    decision = world.die(died(0, 0, position=1), 3.0)
    assert isinstance(decision, Restarted)
    assert [t.index for t in decision.resend[:2]] == [[1], [0, 1]]


def test_a_probe_lost_with_a_worker_dying_at_start_up_is_tried_again_first() -> None:
    world = loop(max_worker_restarts=10)
    dispatch(world.book, batches(4))
    world.die(died(0, 0), 1.0)
    world.die(died(0, 0, position=1), 2.0)
    decision = world.die(died(0, -1, Stage.STARTUP, code=SIGKILL), 3.0)
    assert isinstance(decision, Restarted)
    assert [(t.seq, t.index) for t in decision.resend] == [(0, [1]), (0, [0, 1]), (2, [4, 5])]
    assert world.die(probe_died(0, 0), 4.0) is None  # the probe's death still counts


FETCH, TRACED, ALONE, COLLATE = "fetch", "traced", "alone", "collate"
SURVIVES = ("survives", 0)  # the suspect's probe answers


def _event(world: Loop, what: tuple[str, int], now: float) -> Restarted | bool | None:
    where, code = what
    if what == SURVIVES:
        return world.reply(0)
    if where == ALONE:
        return world.die(probe_died(0, 0, code), now)
    if where == COLLATE:
        return world.die(died(0, 0, Stage.COLLATE, code=code), now)
    return world.die(died(0, 0, position=1 if where == TRACED else -1, code=code), now)


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
    world = loop(max_worker_restarts=10)
    dispatch(world.book, batches(4))
    outcomes = [_event(world, event, float(i)) for i, event in enumerate(events)]
    deaths = [o for e, o in zip(events, outcomes, strict=True) if e != SURVIVES]
    assert all(isinstance(d, Restarted) for d in deaths[:-1])
    assert (deaths[-1] is None) == poison
    if poison:
        step = world.book.next_step()
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
    world = loop(max_worker_restarts=10)
    dispatch(world.book, batches(4, size=1))
    decisions = [world.die(died(0, 0, code=c), float(i)) for i, c in enumerate(codes)]
    assert all(isinstance(d, Restarted) for d in decisions[:-1])
    first = decisions[0]
    assert isinstance(first, Restarted)
    assert [(t.seq, t.index, t.trace) for t in first.resend] == [(0, [0], True), (2, [2], False)]
    assert "after trying dataset index 0 alone" in first.report
    assert (decisions[-1] is None) == poison


def test_under_skip_the_poison_sample_is_left_out_and_the_task_retried_without_it() -> None:
    world = loop(on_error="skip", max_errors=3)
    b = world.book
    dispatch(b, batches(4))
    world.die(died(0, 0), 1.0)
    world.die(died(0, 0, position=1), 2.0)
    decision = world.die(probe_died(0, 0), 3.0)
    assert isinstance(decision, Restarted)
    assert [(t.seq, t.index, t.exclude) for t in decision.resend] == [
        (0, [0, 1], (1,)),
        (2, [4, 5], ()),
    ]
    assert world.reply(0)  # the task itself: no probe goes first any more
    assert isinstance(b.next_step(), Entry)
    assert [(s.index, s.stage) for s in world.skipped] == [(1, "crash")]  # when handed out
    assert world.skipped[0].message.startswith("killed its worker 3 times: killed by signal")
    # Later tasks leave it out up front.
    b.start_epoch(1, 100)
    sent = b.add(0, [0, 1], now=3.0)
    assert sent is not None and sent.exclude == (1,)


def test_a_sample_proven_by_kills_from_outside_is_tried_again_next_epoch() -> None:
    world = loop(on_error="skip", max_errors=3, max_worker_restarts=10)
    b = world.book
    dispatch(b, batches(4))
    world.die(died(0, 0, code=SIGKILL), 1.0)
    world.die(died(0, 0, position=1, code=SIGKILL), 2.0)
    world.die(probe_died(0, 0, SIGKILL), 3.0)
    decision = world.die(probe_died(0, 0, SIGKILL), 4.0)
    assert isinstance(decision, Restarted) and decision.resend[0].exclude == (1,)
    world.reply(0)
    b.next_step()
    assert [(s.index, s.stage) for s in world.skipped] == [(1, "killed")]
    b.start_epoch(1, 100)
    sent = b.add(0, [0, 1], now=9.0)
    assert sent is not None and sent.exclude == ()  # memory pressure may pass: tried again


def test_a_batch_proven_to_kill_outside_fetching_is_settled_empty_under_skip() -> None:
    world = loop(on_error="skip", max_errors=3)
    dispatch(world.book, batches(4))
    world.die(died(0, 0, Stage.COLLATE), 1.0)
    decision = world.die(died(0, 0, Stage.COLLATE), 2.0)
    assert isinstance(decision, Restarted)
    assert [t.seq for t in decision.resend] == [2]  # nothing of batch 0 is tried again
    step = world.book.next_step()
    assert isinstance(step, Entry) and step.seq == 0
    assert [(s.index, s.stage) for s in world.skipped] == [(0, "crash"), (1, "crash")]


def test_deaths_a_sample_is_proven_to_cause_are_not_charged_to_the_restart_budget() -> None:
    # The default budget (3) is smaller than the four deaths that prove a SIGKILL sample.
    world = loop(on_error="skip", max_errors=3)
    dispatch(world.book, batches(4))
    for event in [died(0, 0, code=SIGKILL), died(0, 0, position=1, code=SIGKILL)]:
        assert isinstance(world.die(event, 1.0), Restarted)
    assert isinstance(world.die(probe_died(0, 0, SIGKILL), 2.0), Restarted)
    assert world.judge.charged == 3
    decision = world.die(probe_died(0, 0, SIGKILL), 3.0)
    assert isinstance(decision, Restarted)
    assert "not counted against max_worker_restarts" in decision.report
    assert (world.tally.restarts, world.judge.charged) == (4, 0)
    # Another death, of no sample's doing, has the whole budget again.
    decision = world.die(died(1, 1, code=SIGKILL), 4.0)
    assert isinstance(decision, Restarted) and "(restart 1 of 3)" in decision.report


def test_restart_budget_spent_gives_up_after_earlier_batches() -> None:
    world = loop(max_worker_restarts=0)
    b = world.book
    dispatch(b, batches(4))  # worker 1 holds 1 and 3
    assert world.die(died(1, 1), 1.0) is None
    assert isinstance(b.next_step(), Wait)  # batch 0 is still coming from worker 0
    world.reply(0)
    assert isinstance(b.next_step(), Entry)
    step = b.next_step()
    assert isinstance(step, GiveUp) and "restart budget is spent" in str(step.error)
    assert b.next_worker() is None  # nothing more is sent once giving up


def test_outside_kills_during_start_up_are_bounded_by_the_restart_budget_only() -> None:
    world = loop(max_worker_restarts=3)
    dispatch(world.book, batches(2))
    for i in range(3):
        decision = world.die(died(0, -1, Stage.STARTUP, code=SIGKILL), float(i))
        assert isinstance(decision, Restarted)
    assert world.die(died(0, -1, Stage.STARTUP, code=SIGKILL), 4.0) is None
    step = world.book.next_step()
    assert isinstance(step, GiveUp) and "restart budget is spent" in str(step.error)


def test_two_start_up_deaths_in_a_row_give_up_and_a_ready_worker_resets_the_run() -> None:
    world = loop(max_worker_restarts=10)
    dispatch(world.book, batches(2))
    assert isinstance(world.die(died(0, -1, Stage.STARTUP), 1.0), Restarted)
    world.book.on_ready(0)
    assert isinstance(world.die(died(0, -1, Stage.STARTUP), 2.0), Restarted)
    assert world.die(died(0, -1, Stage.WORKER_INIT), 3.0) is None
    step = world.book.next_step()
    assert isinstance(step, GiveUp) and "died the same way in its replacement" in str(step.error)


def test_an_iterable_datasets_worker_is_not_restarted() -> None:
    world = loop(iterable=True)
    dispatch(world.book, batches(2))
    assert world.die(died(0, 0), 1.0) is None
    step = world.book.next_step()
    assert isinstance(step, GiveUp) and "cannot be resumed in a new process" in str(step.error)


def test_a_worker_the_loop_killed_is_reported_as_killed_and_not_as_evidence() -> None:
    world = loop(max_worker_restarts=10)
    dispatch(world.book, batches(4, size=1))
    reason = "stuck (fetch) past timeout=5, so conveyor killed it"
    world.book.killing(0, kill_reason(reason, "  File 'x'"))
    decision = world.die(died(0, 0, code=SIGKILL), 1.0)
    assert isinstance(decision, Restarted)
    assert "past timeout=5, so conveyor killed it; its Python stack then:\n  File 'x'" in (
        decision.report
    )
    # Not a kill from outside: a death of its own kind, the batch's retry is its probe.
    assert "after trying dataset index 0 alone" in decision.report
    again = world.die(died(0, 0, code=SIGKILL), 2.0)  # now a kill from outside: not the same
    assert isinstance(again, Restarted) and "likeliest cause is the out-of-memory" in again.report


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (SIGKILL, "DataLoader worker (pid 4000) is killed by signal: Killed."),
        (SIGSEGV, "DataLoader worker (pid 4000) is killed by signal: Segmentation fault."),
        (3, "DataLoader worker (pid(s) 4000) exited unexpectedly"),
    ],
)
def test_crash_reports_keep_torchs_words_for_log_alerts(code: int, words: str) -> None:
    world = loop()
    dispatch(world.book, batches(2))
    decision = world.die(died(0, 0, code=code), 1.0)
    assert isinstance(decision, Restarted) and words in decision.report


@pytest.mark.parametrize("forked", [True, False])
def test_the_native_crash_hint_suggests_spawn_only_to_forked_workers(forked: bool) -> None:
    world = loop()
    world.judge.forked = forked
    dispatch(world.book, batches(2))
    decision = world.die(died(0, 0, code=SIGSEGV), 1.0)
    assert isinstance(decision, Restarted)
    assert ("multiprocessing_context='spawn'" in decision.report) == forked


def test_evidence_is_per_epoch() -> None:
    world = loop(max_worker_restarts=10)
    dispatch(world.book, batches(2))
    world.die(died(0, 0), 1.0)
    world.die(died(0, 0, position=1), 2.0)  # index 1 is a suspect in epoch 0
    world.book.start_epoch(1, 100)  # a break: seq 0 names another task now
    dispatch(world.book, batches(2))
    # Epoch 0's evidence would make this death alone its proof; in epoch 1 it is the
    # first against index 1: a suspect, tried alone.
    decision = world.die(died(0, 0, position=1, epoch=1), 3.0)
    assert isinstance(decision, Restarted)
    assert [t.index for t in decision.resend] == [[1], [0, 1]]


# --- workers that share a process (threads_per_worker) --------------------------------


def test_a_bystander_core_is_restarted_with_its_tasks_and_no_evidence_or_charge() -> None:
    world = loop(workers=2, max_worker_restarts=1)
    dispatch(world.book, batches(4))  # worker 0 holds 0 and 2, worker 1 holds 1 and 3
    culprit = replace(died(0, 0), blame=Own((1,)))
    bystander = replace(died(1, 1), blame=Bystander(0))
    first = world.die(culprit, 1.0)
    assert isinstance(first, Restarted)
    assert "Workers 1 ran as threads of the same process and were restarted with it" in (
        first.report
    )
    second = world.die(bystander, 1.0)
    assert isinstance(second, Restarted)
    assert second.report == ""  # said in the culprit's report: one warning a death
    assert [(t.seq, t.trace) for t in second.resend] == [(1, False), (3, False)]
    assert world.judge.charged == 1  # one process died: one restart of one allowed
    # Batch 1 was running when its process died, but not of its doing: when its worker
    # dies at it again, that is its first count, not its second.
    again = world.judge.on_death(replace(died(1, 1), blame=Own((0,))))
    assert isinstance(again, GiveUpAt)  # the budget (1) is spent, not a poison proof
    assert "max_worker_restarts" in str(again.error)


def test_cores_killed_together_from_outside_are_each_evidence_but_charged_once() -> None:
    world = loop(workers=3, max_worker_restarts=1)
    dispatch(world.book, batches(3, size=1))  # one single-sample task each
    deaths = [
        replace(died(w, w, code=SIGKILL),
                blame=Unknown(tuple(i for i in range(3) if i != w), charged=w == 0))
        for w in range(3)
    ]  # fmt: skip
    decisions = [world.die(death, 1.0) for death in deaths]
    assert all(isinstance(d, Restarted) for d in decisions)
    assert world.judge.charged == 1
    # Each sample was named by a death: each is tried alone first in its fresh core.
    for worker, decision in enumerate(decisions):
        assert isinstance(decision, Restarted)
        assert decision.resend[0].index == [worker] and decision.resend[0].trace


def test_a_bystander_of_an_iterable_dataset_gives_up_naming_who_ended_its_process() -> None:
    world = loop(workers=2, iterable=True)
    dispatch(world.book, batches(2))
    decision = world.judge.on_death(replace(died(1, 1), blame=Bystander(0)))
    assert isinstance(decision, GiveUpAt)
    assert "ended with its process, which worker 0 (a thread of the same process) ended" in (
        str(decision.error)
    )
