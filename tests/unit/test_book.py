"""The task book, event by event: facts in, decisions out. No process, no clock, no sleep.

Dead workers are tabled in test_crashes.py, stalls and timeouts in test_deadlines.py.
"""

from __future__ import annotations

import pytest
from tests.helpers.tables import DONE, batches, dispatch, loop, step_kinds

from conveyor._iter import failures
from conveyor._iter.book import FILED, STALE, TaskBook
from conveyor._iter.facts import Position
from conveyor._iter.ledger import Entry
from conveyor._iter.steps import EpochEnd, GiveUp, Wait
from conveyor._iter.tally import Tally
from conveyor._task.protocol import (
    HELD_BEYOND_PREFETCH,
    BatchDone,
    IterationEnded,
    RoomAhead,
    SampleFailed,
    Stage,
    TaskFailed,
)
from conveyor._transport.budget import run_ahead
from conveyor._workers.remote_error import capture


def reply(b: TaskBook, seq: int, room: RoomAhead | None = None, **kw: object) -> bool:
    reply = BatchDone(b.epoch, seq, DONE, **kw)  # type: ignore[arg-type]
    return b.on_reply(b.view.entry(seq).worker_id, reply, room=room) == FILED


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
def test_delivery_order(in_order: bool, arrivals: list[int], expected: list[object]) -> None:
    b = loop(in_order=in_order).book
    assert dispatch(b, batches(4)) == [(0, 0), (1, 1), (0, 2), (1, 3)]
    for seq in arrivals:
        assert reply(b, seq)
    assert step_kinds(b, len(expected)) == expected


def test_epoch_ends_when_every_task_is_handed_out_and_the_sampler_is_done() -> None:
    b = loop().book
    dispatch(b, batches(2))
    b.next_worker()
    b.sampler_ended()
    for seq in (0, 1):
        reply(b, seq)
    assert step_kinds(b, 3) == [0, 1, "EpochEnd"]


def test_capacity_out_of_order_routes_around_a_busy_worker() -> None:
    b = loop(workers=2, prefetch=1, in_order=False).book
    assert dispatch(b, batches(2)) == [(0, 0), (1, 1)]
    reply(b, 1)
    assert isinstance(b.next_step(), Entry)  # worker 1's batch out: it has room again
    assert b.next_worker() == 1  # worker 0 is at capacity (its task still running)


def test_in_order_dispatch_waits_for_its_turn_like_torch() -> None:
    b = loop(workers=2, prefetch=1, in_order=True).book
    dispatch(b, batches(2))
    reply(b, 1)
    assert b.next_worker() == 0  # round-robin, whatever the load


def test_stale_and_repeated_replies_are_refused() -> None:
    b = loop().book
    dispatch(b, batches(2))
    assert reply(b, 0)
    assert not reply(b, 0)  # the same task answered twice (a resent task's late twin)
    assert b.on_reply(0, BatchDone(b.epoch - 1, 1, DONE)) == STALE  # an abandoned epoch
    assert b.on_reply(0, BatchDone(b.epoch, 99, DONE)) == STALE  # never sent


def test_new_epoch_forgets_the_old_epochs_tasks_and_returns_what_came_unused() -> None:
    b = loop().book
    dispatch(b, batches(4))
    reply(b, 0)
    abandoned = b.start_epoch(1, 100)  # persistent workers, the user broke out of epoch 0
    assert [e.seq for e in abandoned] == [0]  # its batch came: the loop gives it back
    assert b.ahead.stale == [1, 2]  # still to answer: 2 (worker 0), 1 and 3
    assert list(b.view.entries()) == []
    assert b.on_reply(0, BatchDone(0, 2, DONE)) == STALE  # epoch 0's replies are stale now
    assert b.ahead.stale == [0, 2]
    assert dispatch(b, batches(1)) == [(0, 0)]
    assert b.epoch == 1


def test_a_resumed_epoch_starts_at_its_position_and_passes_over_what_was_handed_out() -> None:
    b = loop(in_order=True).book
    b.start_epoch(
        1, 100, Position(first_seq=3, first_worker=1, handed_out_before=frozenset({4, 6}))
    )
    sent = []
    for i in range(4):  # positions 3 to 8 drawn: 4 and 6 get no task
        worker = b.next_worker()
        assert worker is not None
        task = b.add(worker, [i], now=0.0)
        while task is None:
            task = b.add(worker, [i], now=0.0)
        sent.append((worker, task.seq))
    assert sent == [(1, 3), (0, 5), (1, 7), (0, 8)]
    for seq in (8, 7, 5, 3):
        reply(b, seq)
    assert step_kinds(b, 4) == [3, 5, 7, 8]


def test_an_iterable_workers_end_makes_it_inactive() -> None:
    b = loop(iterable=True).book
    dispatch(b, batches(4))
    b.on_reply(0, IterationEnded(0, 0))
    assert isinstance(b.next_step(), Entry)
    assert [b.next_worker() for _ in range(3)] == [1, 1, 1]


def test_a_fatal_error_waits_for_every_earlier_batch() -> None:
    b = loop().book
    dispatch(b, batches(4))
    b.give_up(RuntimeError("late"), 2)
    b.give_up(RuntimeError("later"), 3)  # the earliest placed is the one raised
    assert b.next_worker() is None  # nothing more is sent once giving up
    reply(b, 1)
    assert isinstance(b.next_step(), Wait)  # batch 0 still to come
    reply(b, 0)
    assert step_kinds(b, 3) == [0, 1, "GiveUp"]
    step = b.next_step()
    assert isinstance(step, GiveUp) and str(step.error) == "late"


# --- skips --------------------------------------------------------------------------


def failed_sample(index: int) -> SampleFailed:
    return SampleFailed(index, Stage.FETCH, capture(ValueError(f"bad {index}")))


def test_skip_budget_is_judged_in_delivery_order() -> None:
    world = loop(on_error="skip", max_errors=0)
    b = world.book
    dispatch(b, batches(4))
    reply(b, 1, skipped=(failed_sample(2),))  # arrives first, but comes second
    reply(b, 0)
    assert step_kinds(b, 1) == [0]  # the earlier batch is delivered first
    step = b.next_step()
    assert isinstance(step, GiveUp) and isinstance(step.error, ValueError)
    assert "max_errors=0" in step.error.__notes__[-1]
    assert [s.index for s in world.skipped] == [2]


def test_skipped_samples_within_budget_are_recorded_with_their_epoch_and_stage() -> None:
    world = loop(on_error="skip", max_errors=2)
    b = world.book
    dispatch(b, batches(2))
    reply(b, 0, skipped=(failed_sample(1),))
    b.next_step()
    assert [(s.index, s.epoch, s.worker_id, s.stage, s.exception_type) for s in world.skipped] == [
        (1, 0, 0, "fetch", "builtins.ValueError")
    ]


# --- failures in user code ----------------------------------------------------------


def test_task_failure_is_handed_out_in_order_with_its_context() -> None:
    b = loop().book
    dispatch(b, batches(2))
    b.on_reply(1, TaskFailed(0, 1, Stage.COLLATE, capture(KeyError("label"))))
    reply(b, 0)
    assert step_kinds(b, 1) == [0]
    step = b.next_step()
    assert isinstance(step, Entry) and isinstance(step.reply, TaskFailed)
    entry = step
    error = failures.task_failed(step.reply, entry.worker_id, 77, entry.indices)
    assert isinstance(error, KeyError)
    context = error.conveyor_context  # type: ignore[attr-defined]
    assert (context.worker_id, context.pid, context.stage, context.indices, context.seq) == (
        1,
        77,
        "collate",
        (2, 3),
        1,
    )


def test_nothing_is_handed_out_after_the_epoch_ends() -> None:
    b = loop(workers=1, prefetch=1).book
    b.sampler_ended()
    assert isinstance(b.next_step(), EpochEnd)


# --- run-ahead ----------------------------------------------------------------------


def _top_up(b: TaskBook, first: int) -> list[tuple[int, int]]:
    """Send while the book wants tasks; (worker, seq) of each sent."""
    sent = []
    while b.wants_task():
        worker = b.next_worker()
        assert worker is not None
        task = b.add(worker, [first + len(sent)], now=0.0)
        assert task is not None
        sent.append((worker, task.seq))
    return sent


def test_run_ahead_lets_more_tasks_out_round_robin_then_one_per_hand_out() -> None:
    b = loop(workers=2, prefetch=2).book
    assert len(_top_up(b, 0)) == 4  # torch's count: prefetch x workers
    b.ahead.allow(3)
    more = _top_up(b, 4)
    assert more == [(0, 4), (1, 5), (0, 6), (1, 7), (0, 8), (1, 9)]  # still round-robin
    reply(b, 0)
    assert not b.wants_task()  # a reply does not free a place: handing out does
    assert step_kinds(b, 1) == [0]
    assert len(_top_up(b, 10)) == 1


MiB = 1 << 20


def room(slot: int, prefetch: int = 2, budget: int = 8 * MiB) -> RoomAhead | None:
    """What the process pool says of a batch that came in a slot of ``slot`` bytes (0:
    through the pipe), its workers' share of the run-ahead budget being ``budget``."""
    if not slot:
        return None
    return RoomAhead(slot, run_ahead(slot, prefetch + HELD_BEYOND_PREFETCH, budget))


@pytest.mark.parametrize(
    ("busy_s", "slot", "run_ahead"),
    [
        (0.0005, 64 << 10, 122),  # 8 MiB // 64 KiB, less prefetch 2 + 4 slots
        (0.0005, 2 * MiB, 0),  # big batches: the budget holds no more than prefetch
        (0.002, 64 << 10, 0),  # slow batches: what is left after a break stays short
        (0.0005, 0, 0),  # a batch sent through the pipe: no slot size to go by
    ],
)
def test_small_quick_batches_run_ahead(busy_s: float, slot: int, run_ahead: int) -> None:
    b = loop(workers=2, prefetch=2).book
    dispatch(b, batches(2))
    reply(b, 0, room=room(slot), busy_s=busy_s)
    assert b.ahead.extra == run_ahead


def test_the_run_ahead_waits_for_an_abandoned_epochs_replies_and_restarts_each_epoch() -> None:
    b = loop(workers=2, prefetch=1).book
    dispatch(b, batches(2))
    b.start_epoch(1, 100)  # a break: both tasks of epoch 0 still out
    dispatch(b, batches(2))
    reply(b, 0, room=room(64 << 10, prefetch=1), busy_s=0.0005)
    assert b.ahead.extra == 0  # not while slots of the last epoch are still to come back
    for worker in (0, 1):
        assert b.on_reply(worker, BatchDone(0, worker, DONE)) == STALE
    reply(b, 1, room=room(64 << 10, prefetch=1), busy_s=0.0005)
    assert b.ahead.extra > 0
    b.start_epoch(2, 100)
    assert b.ahead.extra == 0
    assert len(_top_up(b, 0)) == 2


def test_slots_filled_by_batches_waiting_withdraw_the_run_ahead_silently() -> None:
    b = loop(workers=2, prefetch=2).book
    b.ahead.allow(5)
    assert not b.ahead.slots_exhausted(held_in_worker=0, held_by_loop=1)
    assert b.ahead.extra == 0
    assert b.ahead.slots_exhausted(held_in_worker=0, held_by_loop=9)  # the user keeps them: say so
    assert not b.ahead.slots_exhausted(held_in_worker=2, held_by_loop=0)  # once


def test_no_task_is_wanted_once_the_sampler_ended_or_the_book_gave_up() -> None:
    b = loop(workers=1, prefetch=1).book
    b.ahead.allow(5)
    b.sampler_ended()
    assert not b.wants_task()


def test_a_batchs_sample_count_comes_from_its_task_when_the_task_can_say() -> None:
    b = loop(on_error="skip").book
    tally = Tally(2)
    (_, plain), (w1, skipping) = dispatch(b, [[0, 1, 2], [3, 4, 5]])
    reply(b, plain)
    b.on_reply(w1, BatchDone(b.epoch, skipping, DONE, skipped=(failed_sample(4),)))
    tally.delivered_from(b.view.entry(plain), "a batch of tensors")  # never looked at
    assert tally.samples == 3
    tally.delivered_from(b.view.entry(skipping), [[3, 5]])  # only the batch knows: 2
    assert tally.samples == 5
    iterable = loop(iterable=True).book
    [(_, seq)] = dispatch(iterable, [[None, None]])  # type: ignore[list-item]
    reply(iterable, seq)
    tally.delivered_from(iterable.view.entry(seq), [[7]])  # an iterable's batch may be short
    assert (tally.batches, tally.samples) == (3, 6)
