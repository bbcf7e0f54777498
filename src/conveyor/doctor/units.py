"""Numbers as the report and the advice write them: durations, byte counts, plurals."""

from __future__ import annotations

from conveyor.diagnostics.findings import plural  # one definition, re-exported here

__all__ = ["fmt_bytes", "fmt_seconds", "plural"]


def fmt_seconds(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.1f} ms" if seconds < 1.0 else f"{seconds:.2f} s"


def fmt_bytes(count: float) -> str:
    if count < 1000:
        return f"{count:.0f} B"
    for unit in ("kB", "MB", "GB"):
        count /= 1000
        if count < 1000 or unit == "GB":
            break
    return f"{count:.1f} {unit}"
