"""The pool's selector, on real pipes (no process): while the loop awaits one worker's
reply, another's waits in its pipe, but never past a deadline, nor past its end."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from conveyor._workers.selector import PoolSelector


@dataclass
class Pipe:
    """A worker's result pipe, as the selector sees it: read end, write end, a name."""

    r: int
    w: int
    name: str

    def reply(self) -> None:
        os.write(self.w, b"x")


@pytest.fixture
def pipes() -> Iterator[tuple[PoolSelector, Pipe, Pipe]]:
    selector = PoolSelector()
    made = []
    for name in ("a", "b"):
        r, w = os.pipe()
        made.append(Pipe(r, w, name))
        selector.watch(r, "result", name, deferred=True)
    yield selector, made[0], made[1]
    selector.close()
    for pipe in made:
        for fd in (pipe.r, pipe.w):
            with contextlib.suppress(OSError):  # closed by the test
                os.close(fd)


def _never_flushed(owner: object) -> bool:
    raise AssertionError("no task pipe is watched here")


def _ready(selector: PoolSelector, timeout: float | None, awaited: Pipe | None) -> list[str]:
    fd = None if awaited is None else awaited.r
    return sorted(owner for _, owner in selector.select(timeout, _never_flushed, fd))


def test_a_reply_that_is_not_awaited_waits_in_its_pipe(
    pipes: tuple[PoolSelector, Pipe, Pipe],
) -> None:
    selector, a, b = pipes
    b.reply()
    a.reply()
    assert _ready(selector, None, a) == ["a"]  # b's is there too, not asked for
    assert _ready(selector, None, b) == ["b"]  # and now a's waits
    assert _ready(selector, None, None) == ["a", "b"]  # both still there, unread


def test_a_wait_that_runs_out_has_looked_at_every_pipe(
    pipes: tuple[PoolSelector, Pipe, Pipe],
) -> None:
    # The deadlines judge what the workers sent: a reply left unread would look late.
    selector, a, b = pipes
    b.reply()
    assert _ready(selector, 0.0, a) == ["b"]
    assert _ready(selector, 0.0, a) == ["b"]  # and again next time
    os.read(b.r, 1)
    assert _ready(selector, 0.0, a) == []


def test_the_end_of_a_pipe_not_awaited_ends_the_wait(
    pipes: tuple[PoolSelector, Pipe, Pipe],
) -> None:
    # Its worker is gone: the loop must hear it now, not when it turns to its batch.
    # (Broken, this wait would block for good: the test's timeout says so.)
    selector, a, b = pipes
    os.close(b.w)
    assert _ready(selector, None, a) == ["b"]


def test_a_pipe_of_frames_too_large_for_it_is_read_in_every_wait(
    pipes: tuple[PoolSelector, Pipe, Pipe],
) -> None:
    # Left unread, such a frame would hold its writer until the loop turned to it.
    selector, a, b = pipes
    assert _ready(selector, 0.0, a) == []  # b is deferred now
    selector.never_defer(b.r)
    b.reply()
    assert _ready(selector, None, a) == ["b"]  # (broken: blocks; the test's timeout says so)


def test_a_pipe_no_longer_watched_is_forgotten(pipes: tuple[PoolSelector, Pipe, Pipe]) -> None:
    # A replacement's pipe may get the same number: it starts watched, like any.
    selector, a, b = pipes
    assert _ready(selector, 0.0, a) == []  # b is deferred now
    selector.unwatch(b.r)
    assert not selector.watching(b.r)
    selector.watch(b.r, "result", "b2", deferred=True)
    b.reply()
    assert _ready(selector, None, None) == ["b2"]
