"""A Ctrl-C is noted wherever it lands while thread workers run (interrupts.py): the
program's SIGINT handler is wrapped, not replaced, and put back as it was. Real signals,
raised in this process's main thread; no worker."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

from conveyor._workers import interrupts


@pytest.fixture
def program_handler(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The program's own SIGINT handler (it records each Ctrl-C), and a clean slate."""
    monkeypatch.setattr(interrupts, "_interrupted", False)
    monkeypatch.setattr(interrupts, "_watching", 0)
    seen: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> Any:
        seen.append(signum)

    before = signal.signal(signal.SIGINT, handler)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, before)


def test_while_watched_a_ctrl_c_is_noted_and_handed_to_the_programs_handler(
    program_handler: list[int],
) -> None:
    ours = signal.getsignal(signal.SIGINT)
    interrupts.watch_ctrl_c()
    signal.raise_signal(signal.SIGINT)  # lands in this test's code, not in a loader
    assert interrupts.interrupted() and program_handler == [signal.SIGINT]
    interrupts.unwatch_ctrl_c()
    assert signal.getsignal(signal.SIGINT) is ours


def test_unwatched_a_ctrl_c_is_the_programs_alone(program_handler: list[int]) -> None:
    interrupts.watch_ctrl_c()
    interrupts.unwatch_ctrl_c()
    signal.raise_signal(signal.SIGINT)
    assert program_handler == [signal.SIGINT] and not interrupts.interrupted()


def test_the_handler_stays_wrapped_until_the_last_pool_closes(
    program_handler: list[int],
) -> None:
    interrupts.watch_ctrl_c()
    interrupts.watch_ctrl_c()
    interrupts.unwatch_ctrl_c()
    signal.raise_signal(signal.SIGINT)
    assert interrupts.interrupted()
    interrupts.unwatch_ctrl_c()


def test_a_pool_opened_inside_a_deferral_is_watched_from_its_end(
    program_handler: list[int],
) -> None:
    """Pools are made and closed while Ctrl-C is held back: the deferral's end puts back
    the wanted handler, and hands the Ctrl-C it held to it."""
    with interrupts.interrupts_deferred():
        interrupts.watch_ctrl_c()
        signal.raise_signal(signal.SIGINT)  # held
        assert program_handler == []
    assert interrupts.interrupted() and program_handler == [signal.SIGINT]
    with interrupts.interrupts_deferred():
        interrupts.unwatch_ctrl_c()
    assert not isinstance(signal.getsignal(signal.SIGINT), interrupts._Noting)


def test_a_handler_the_program_put_in_meanwhile_is_left_alone(
    program_handler: list[int],
) -> None:
    interrupts.watch_ctrl_c()
    later: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: later.append(signum))
    interrupts.unwatch_ctrl_c()
    signal.raise_signal(signal.SIGINT)
    assert later == [signal.SIGINT] and not interrupts.interrupted()


def test_an_ignored_ctrl_c_stays_ignored(program_handler: list[int]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    interrupts.watch_ctrl_c()
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    interrupts.unwatch_ctrl_c()
