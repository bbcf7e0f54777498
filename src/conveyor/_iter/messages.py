"""The words of the loop's reports: pure functions of the facts.

What happened, where (worker, batch, dataset indices, stage), why, and the
fix, in that order. The task book, the crash judge and the deadlines decide;
these only say it.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from conveyor._task.protocol import Busy, Died, WorkerStatus

__all__ = [
    "ABANDONED_THREAD",
    "DECODE_FAILED",
    "LEFT_OUT_AGAIN",
    "NO_RESTART_ITERABLE",
    "SAME_DEATH_AT_START",
    "crash_over_budget",
    "death_summary",
    "describe_exit",
    "doing",
    "iterable_length",
    "kill_reason",
    "left_out_for_crashes",
    "not_started",
    "not_started_report",
    "poison_proof",
    "restart_budget_spent",
    "restart_report",
    "short",
    "slots_held",
    "stall_report",
    "startup_failed",
    "stuck_reason",
    "timeout_text",
    "torch_words",
    "typical_batch_time",
    "with_stack",
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


_LIKELY_CAUSE = {
    signal.SIGKILL: "the likeliest cause is the out-of-memory killer (check `dmesg` and the "
    "memory limit of the machine or container; lower batch_size, prefetch_factor or "
    "num_workers)",
    signal.SIGSEGV: "a crash in native code (a C extension, a corrupt file handed to a "
    "decoder, or a library that is not fork-safe: try multiprocessing_context='spawn')",
    signal.SIGABRT: "native code aborted (an assertion in a C/C++ library)",
    signal.SIGBUS: "shared memory ran out (free space in /dev/shm or the memory limit)",
    signal.SIGTERM: "something outside conveyor terminated it",
}


_SEGV_UNFORKED = "a crash in native code (a C extension, or a corrupt file handed to a decoder)"


def describe_exit(exitcode: int | None, forked: bool = True) -> str:
    """Why a worker exited, in words. ``forked``: the workers were started by fork,
    so a library that is not fork-safe is a suspect (spawn would not help otherwise)."""
    if exitcode is None:
        return "it is still running"
    if exitcode < 0:
        signum = -exitcode
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        text = f"killed by signal {name} ({exitcode})"
        cause = _LIKELY_CAUSE.get(signum)  # type: ignore[call-overload]
        if signum == signal.SIGSEGV and not forked:
            cause = _SEGV_UNFORKED
        return f"{text}; {cause}" if cause else text
    return (
        f"exit code {exitcode}, without an error being reported (something in the "
        "worker called sys.exit() or os._exit(), or the interpreter aborted)"
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
        "network read, a lock), raise timeout, or pass on_timeout='restart' to replace the "
        "stuck worker and retry."
    )


def stuck_reason(stage: str, timeout: float, ended: str = "killed") -> str:
    """Why conveyor ended a worker (``on_timeout="restart"``): ``ended`` is "killed" (a
    process) or "abandoned" (a thread, which cannot be killed)."""
    reason = f"stuck ({stage}) past timeout={timeout}, so conveyor {ended} it"
    if ended == "abandoned":
        reason += f" ({ABANDONED_THREAD})"
    return reason


ABANDONED_THREAD = (
    "a thread cannot be killed: it is never used or waited for again, ends by itself if "
    "its sample ever returns, and does not keep the interpreter from exiting"
)


def kill_reason(reason: str, stacks: str) -> str:
    return f"{reason}; its Python stack then:\n{stacks}" if stacks else reason


def with_stack(text: str, stacks: str) -> str:
    """A timeout's message with the stuck worker's stack."""
    return f"{text}\nThe worker's current Python stack:\n{stacks}" if stacks else text


# --- crashes ----------------------------------------------------------------------------

NO_RESTART_ITERABLE = (
    "An iterable-style dataset's iterator cannot be resumed in a new process, "
    "so conveyor does not restart workers for it."
)
SAME_DEATH_AT_START = (
    "It died the same way in its replacement, before any task: this is not a passing failure."
)
LEFT_OUT_AGAIN = "killed its worker in an earlier epoch; left out without trying again"


def restart_budget_spent(limit: int) -> str:
    return (
        f"The restart budget is spent (max_worker_restarts={limit}); raise it to tolerate "
        "more crashes."
    )


def _times(crashes: int) -> str:
    return f"{crashes} times" if crashes != 2 else "twice"


def poison_proof(poison: Any, crashes: int, alone: int) -> str:
    """Why the loader gives up: ``poison`` (None: the batch as a whole) is proven to
    kill its worker, and nothing may be left out."""
    if poison is None:
        return (
            f"This batch killed its worker {_times(crashes)} (the first time, and again on "
            "each retry), outside fetching samples; pass on_error='skip' to leave it out."
        )
    last = "the last time" if alone == 1 else f"the last {alone} times"
    return (
        f"Dataset index {poison!r} killed its worker {_times(crashes)}, {last} alone in a "
        "fresh worker: that sample is the cause, not the machine. Fix the sample, or pass "
        "on_error='skip' to leave it out."
    )


def left_out_for_crashes(crashes: int, exit_text: str) -> str:
    return f"killed its worker {_times(crashes)}: {exit_text}"


def crash_over_budget(index: Any, why: str, budget_note: str) -> str:
    return f"Dataset index {index!r} {why}. {budget_note}"


def restart_report(
    summary: str, proven: bool, charged: int, limit: int, retried: int, probes: list[Any]
) -> str:
    """A WorkerRestartedWarning's text: the death, the restart, what was re-sent."""
    if proven:
        counted = "not counted against max_worker_restarts: the sample is the cause"
    else:
        counted = f"restart {charged} of {limit}"
    tried = (
        f", after trying dataset index {', '.join(map(repr, probes))} alone in it first "
        "(a sample that kills a fresh worker by itself is the cause; one that does not "
        "is cleared)"
        if probes
        else ""
    )
    return (
        f"{summary} Started a replacement ({counted}) and re-sent its {retried} unanswered "
        f"task(s){tried}; no sample is lost or repeated."
    )


def restarted_with(siblings: tuple[int, ...]) -> str:
    """What a restart report adds for a worker that ran as a thread of a process with
    other workers (threads_per_worker): they were restarted with it."""
    if not siblings:
        return ""
    names = ", ".join(map(str, siblings))
    return (
        f" Workers {names} ran as threads of the same process and were restarted with it; "
        "their unanswered tasks were re-sent too."
    )


def bystander_death(death: Died, ended_by: int, indices: tuple[Any, ...]) -> str:
    """A worker that ended with its process, which another worker's thread ended."""
    held = f" It held dataset indices {short(indices)}." if indices else ""
    return (
        f"DataLoader worker {death.worker_id} (pid {death.pid}) ended with its process, "
        f"which worker {ended_by} (a thread of the same process) ended.{held}"
    )


def startup_failed(
    worker_id: int, pid: int | None, exc: BaseException, *, remote: bool = False
) -> str:
    """``remote``: the worker is a Ray actor (its fix is on the cluster's side)."""
    fix = (
        "make that module importable on the cluster's nodes: install it there, or ship "
        "it with worker_options={'runtime_env': {'py_modules': [...]}} (or "
        "{'working_dir': '.'}); a runtime environment that fails to set up says why above"
        if remote
        else "make that module importable in the worker, or use multiprocessing_context='fork'"
    )
    return (
        f"DataLoader worker {worker_id} (pid {pid}) could not start: "
        f"{type(exc).__name__}: {exc}. This usually means the dataset, collate_fn or "
        "worker_init_fn refers to something the worker process cannot import (a module "
        "missing from its sys.path, or a class defined in a module that is not "
        f"importable there). Fix: {fix}."
    )


# --- batches ----------------------------------------------------------------------------

DECODE_FAILED = (
    "The batch was sent by the worker but could not be rebuilt in the main "
    "process: something in it unpickles differently here (a class this process "
    "cannot import, a __setstate__ or __reduce__ that fails)."
)


def slots_held(worker_id: int, held_in_worker: int) -> str:
    """Why a worker's batches now go through its pipe (a BatchesHeldWarning)."""
    if held_in_worker:
        why = (
            f"{held_in_worker} of them are held by arrays the worker itself keeps (a "
            "collate_fn or dataset that keeps earlier batches, e.g. a memory bank), "
            "so that memory cannot be reused. Fix: keep copies (.clone() or .copy()) "
            "of what the worker keeps across batches."
        )
    else:
        why = (
            "they are held by batches still alive in this process (the loop keeps "
            "references to many batches, e.g. appends them to a list). Fix: keep only "
            "what you need (e.g. .clone() or .copy() the part you keep)."
        )
    return (
        f"DataLoader worker {worker_id}: every shared-memory slot is in use, so batches "
        f"are now copied through a pipe (slower): {why}"
    )


def iterable_length(dataset: Any, length: int, yielded: int, workers: bool) -> str:
    """torch's words when an iterable dataset yields more batches than its len()."""
    text = (
        f"Length of IterableDataset {dataset} was reported to be {length} (when accessing "
        f"len(dataloader)), but {yielded} samples have been fetched."
    )
    if workers:
        text += (
            " For multiprocessing data-loading, this could be caused by not properly "
            "configuring the IterableDataset replica at each worker (shard it with "
            "get_worker_info())."
        )
    return text
