"""A timeline users can open: every stage of every batch, per worker and main process.

Written in the Trace Event format (JSON) that Perfetto (ui.perfetto.dev) and
``chrome://tracing`` open: one lane per worker and one for the training loop, process
and thread named. Worker spans come from the timings each batch's reply carries (the
workers' monotonic clock: the same clock as the main process's on one machine); the
main process's spans (waiting in ``next()``, decoding, pinning) are its own. Inside a
``torch.profiler`` profile the main process's spans also go to torch's own trace.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

__all__ = ["Tracer", "recording", "torch_span"]

logger = logging.getLogger("conveyor")

MAIN_TID = 1
_WORKER_TID = 1_000_000  # thread workers' lanes: this plus the worker id


class Tracer:
    """Spans recorded while tracing; :meth:`write` saves them as Trace Event JSON."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._events: list[dict[str, Any]] = []
        self._lanes: dict[tuple[int, int], str] = {(self._pid, MAIN_TID): "training loop"}
        self._lock = threading.Lock()  # spans may come from the pin thread too

    def main_span(self, name: str, start_s: float, duration_s: float, **args: Any) -> None:
        self._span(name, self._pid, MAIN_TID, start_s, duration_s, args)

    def worker_span(
        self,
        worker_id: int,
        pid: int | None,
        name: str,
        start_s: float,
        duration_s: float,
        **args: Any,
    ) -> None:
        """A span of worker ``worker_id``: its own process lane, or (a thread worker, or
        a worker whose pid is unknown) a lane in the main process."""
        if pid is None or pid == self._pid:
            key = (self._pid, _WORKER_TID + worker_id)
        else:
            key = (pid, pid)
        self._lanes.setdefault(key, f"worker {worker_id}")
        self._span(name, key[0], key[1], start_s, duration_s, args)

    def _span(
        self, name: str, pid: int, tid: int, start_s: float, duration_s: float, args: Any
    ) -> None:
        event = {
            "name": name,
            "ph": "X",
            "pid": pid,
            "tid": tid,
            "ts": start_s * 1e6,
            "dur": max(0.0, duration_s) * 1e6,
        }
        if args:
            event["args"] = args
        with self._lock:
            self._events.append(event)

    def document(self) -> dict[str, Any]:
        meta: list[dict[str, Any]] = []
        for (pid, tid), name in self._lanes.items():
            process = "conveyor main process" if pid == self._pid else f"conveyor {name}"
            meta.append(_meta("process_name", pid, tid, process))
            meta.append(_meta("thread_name", pid, tid, name))
        with self._lock:
            events = list(self._events)
        return {"traceEvents": meta + events, "displayTimeUnit": "ms"}

    def write(self, path: str | os.PathLike[str]) -> Path:
        target = Path(path)
        target.write_text(json.dumps(self.document()))
        return target


@contextmanager
def recording(
    path: str | os.PathLike[str], attach: Callable[[Tracer | None], None]
) -> Iterator[Tracer]:
    """``DataLoader.trace(path)``: the file is opened now, so a path that cannot be
    written fails before any training, naming it; ``attach`` puts the tracer where the
    loop records (None: recording ends). At the end the trace is written whatever the
    block did; a write that fails then (a full disk) is logged, never raised: it must
    not end a run that trained, nor replace the block's own exception."""
    target = Path(path)
    try:
        out = target.open("w")
    except OSError as error:
        raise type(error)(
            error.errno,
            f"loader.trace() cannot write its trace there ({error.strerror}). Fix: pass "
            "a path in a directory that exists and that this process may write to",
            str(target),
        ) from None
    tracer = Tracer()
    attach(tracer)
    try:
        yield tracer
    finally:
        attach(None)
        _save(tracer, out, target)


def _save(tracer: Tracer, out: IO[str], target: Path) -> None:
    try:
        with out:
            json.dump(tracer.document(), out)
    except Exception as error:
        logger.error(  # (the words only: a record holding the error keeps its frames)
            f"conveyor: the trace could not be written to {target} "
            f"({type(error).__name__}: {error}); training was not affected."
        )


def _meta(kind: str, pid: int, tid: int, name: str) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


@contextmanager
def torch_span(name: str) -> Iterator[None]:
    """The block as a span in torch's profiler, when one is recording (else nothing)."""
    profiler = sys.modules.get("torch.autograd.profiler")
    if profiler is None or not getattr(profiler, "_is_profiler_enabled", False):
        yield
        return
    with profiler.record_function(name):
        yield
