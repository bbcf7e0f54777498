"""Say in words why a worker process exited."""

from __future__ import annotations

import signal

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
