"""The words of the supervisor's reports: pure functions of the facts.

What happened, where (worker, batch, dataset indices, stage), why, and the
fix, in that order. The task book decides; these only say it.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._workers.exits import describe_exit
from .._workers.status import WorkerStatus

if TYPE_CHECKING:
    from .._workers.events import Died
    from .book import Busy

__all__ = [
    "death_summary",
    "describe_exit",
    "doing",
    "not_started",
    "not_started_report",
    "short",
    "stall_report",
    "timeout_text",
    "torch_words",
    "typical_batch_time",
]


def short(indices: tuple[Any, ...], limit: int = 16) -> str:
    shown = ", ".join(repr(i) for i in indices[:limit])
    return f"[{shown}{', ...' if len(indices) > limit else ''}]"


def typical_batch_time(batch_time: float) -> str:
    """The workers' own time per batch (not the consumer's pace)."""
    if not batch_time:
        return "no typical batch time is known yet"
    return f"a worker usually takes {batch_time * 1000:.3g} ms per batch"


def death_summary(
    death: Died,
    exit_text: str,
    indices_of: Callable[[int], tuple[Any, ...]],
    held: list[int],
    culprit: int | None,
    *,
    sample: Any = None,
    alone: bool = False,
) -> str:
    """``sample``: the dataset index the worker died at, if known; ``alone``: it was
    being tried alone in a fresh worker."""
    status = death.status
    where = ""
    if status.stage is not None:
        where = f" during {status.stage.value}"
        if culprit is not None:
            indices = indices_of(culprit)
            where += f" of batch {culprit} (dataset indices {short(indices)})"
            if sample is not None:
                where += f", at dataset index {sample!r}"
                where += " (tried alone in a fresh worker)" if alone else ""
    holding = tuple(i for seq in held for i in indices_of(seq))
    held_text = f" It held dataset indices {short(holding)}." if holding else ""
    return (
        f"DataLoader worker {death.worker_id} (pid {death.pid}) exited "
        f"unexpectedly{where}: {exit_text}.{held_text} {torch_words(death)}"
    )


def torch_words(death: Died) -> str:
    """What torch's DataLoader says for the same death, verbatim, so that log alerts
    written for torch's messages still fire."""
    code = death.exitcode
    if code is not None and code < 0:
        try:
            name = signal.strsignal(-code) or f"signal {-code}"
        except ValueError:
            name = f"signal {-code}"
        return f"(torch: DataLoader worker (pid {death.pid}) is killed by signal: {name}.)"
    return f"(torch: DataLoader worker (pid(s) {death.pid}) exited unexpectedly.)"


def doing(status: WorkerStatus, known: bool, indices: tuple[Any, ...]) -> str:
    return f"batch {status.seq} (dataset indices {short(indices)})" if known else "start-up"


def not_started(seq: int, indices: tuple[Any, ...], idle_s: float) -> str:
    return (
        f"batch {seq} (dataset indices {short(indices)}) waiting for it, but it has not "
        f"started it: it has been idle for {idle_s:.1f} s. It may be frozen (stopped by "
        "SIGSTOP or a debugger) or blocked outside conveyor's code"
    )


def not_started_report(busy: Busy, seq: int, indices: tuple[Any, ...], batch_time: float) -> str:
    return (
        f"DataLoader worker {busy.worker_id} (pid {busy.pid}) has "
        f"{not_started(seq, indices, busy.status.age_s)}; {typical_batch_time(batch_time)}."
    )


def stall_report(busy: Busy, indices: tuple[Any, ...], batch_time: float) -> str:
    status = busy.status
    assert status.stage is not None
    return (
        f"DataLoader worker {busy.worker_id} (pid {busy.pid}) has spent {status.age_s:.0f} s "
        f"on batch {status.seq} (dataset indices {short(indices)}), in stage {status.stage.value}; "
        f"{typical_batch_time(batch_time)}. It may be stuck (a dead network mount, a lock, "
        "an endless loop)."
    )


def timeout_text(timeout: float, busy: Busy, doing: str, stage: str, batch_time: float) -> str:
    where = "" if stage == "not started" else f", in stage {stage}"
    verb = "has" if stage == "not started" else "has been on"
    return (
        f"DataLoader timed out after {timeout} seconds: worker {busy.worker_id} "
        f"(pid {busy.pid}) {verb} {doing}{where}; "
        f"{typical_batch_time(batch_time)}. Fix: find what blocks it (a slow disk or "
        "network read, a lock), raise timeout, or pass on_timeout='restart' to kill the "
        "stuck worker and retry."
    )
