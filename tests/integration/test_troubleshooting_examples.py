"""Every message quoted in docs/troubleshooting.md comes from running the page's own code.

The page marks its code blocks and quotes with HTML comments just above them:

    <!-- example: NAME -->    the failing code (a python block)
    <!-- torch: NAME -->      what torch's DataLoader says running that code (a text block)
    <!-- conveyor: NAME -->   what conveyor says (a text block)
    <!-- fixed: NAME -->      the fixed code (a python block): it must run without an error
    <!-- output: NAME -->     what the fixed code prints (a text block)
    <!-- module: NAME -->     a python block saved as NAME.py, for the doctor example
    <!-- doctor: NAME -->     ``$ conveyor doctor ARGS`` and its output (a text block)

One subprocess (this file run as a script) executes every example, each in a fresh
``__main__`` module, in a directory holding the files the examples read, and records
what each raised, warned and printed. The torch variant is the same code with
``from conveyor import DataLoader`` replaced by torch's import. A quote matches when its
pieces between ``...`` appear in the real text in order; line breaks count as spaces.

:data:`EXAMPLES` is the table: what each example must raise and warn, and key phrases
that both the real message and the page's quote must contain, so that trimming a quote
cannot make its check vacuous, and a message that loses its point fails here. For
torch's messages too; those quote only what torch prints every time, never a wording
that depends on which of its threads or signal handlers sees a failure first.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
import types
import warnings
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# Runs every example of the page in a subprocess (about 20 s): with ``-m slow``, as CI does.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "troubleshooting.md"
CONVEYOR_IMPORT = "from conveyor import DataLoader"
TORCH_IMPORT = "from torch.utils.data import DataLoader"
SCRIPT = "train.py"  # the file name the examples' tracebacks and stacks show
_BLOCK = re.compile(
    r"<!-- (example|torch|conveyor|fixed|output|module|doctor): ([\w.-]+) -->\s*\n"
    r"```(\w*)\n(.*?)\n```",
    re.DOTALL,
)


@dataclass(frozen=True)
class Example:
    """What running an example must show. Exception and warning classes by name."""

    raises: str | None  # under conveyor
    warns: tuple[str, ...] = ()  # under conveyor, in order of first appearance
    key_phrases: tuple[str, ...] = ()  # in the real message and in the page's quote
    torch_raises: str | None = None  # when the page quotes torch as well
    torch_phrases: tuple[str, ...] = ()  # in torch's real message and in the page's quote
    fixed_warns: tuple[str, ...] = ()  # warnings the fixed code still (rightly) gives
    fixed: bool = True  # False: the page's fix for it is another example's


EXAMPLES: dict[str, Example] = {
    "sqlite-spawn": Example(
        raises="UnpicklableError",
        key_phrases=("dataset.db.connection", "sqlite3.Connection", "Fix:"),
        torch_raises="TypeError",
        torch_phrases=("cannot pickle 'sqlite3.Connection' object",),
    ),
    "file-fork": Example(
        raises=None,
        warns=("PreflightWarning",),
        key_phrases=("dataset.file", "share its file offset", "per_worker(open, 'records.bin'"),
    ),
    "sqlite-fork": Example(
        raises="ConfigError",
        key_phrases=("dataset.connection", "must not cross a fork", "conveyor.per_worker("),
    ),
    "sqlite-getstate": Example(
        raises="AttributeError",
        key_phrases=(
            "'NoneType' object has no attribute 'execute'",
            "Raised in DataLoader",
            'File "train.py", line 18, in __getitem__',
        ),
        fixed=False,  # the fix is sqlite-fork's
    ),
    "collate-keys": Example(
        raises="CollateKeyError",
        key_phrases=("'label'", "dataset indices 2, 5", "{'image', 'label'}", "Fix:"),
        torch_raises="KeyError",
        torch_phrases=("KeyError: 'label'",),
    ),
    "ragged": Example(
        raises="CollateShapeError",
        key_phrases=("(3, 32, 32)", "(3, 32, 40)", "dataset index 1", "Fix:"),
        torch_raises="RuntimeError",
        torch_phrases=("stack expects each tensor to be equal size",),
    ),
    "none-sample": Example(
        raises="CollateTypeRuntimeError",
        key_phrases=("NoneType at dataset index 3", "Fix:"),
        torch_raises="RuntimeError",
        torch_phrases=("Could not infer dtype of NoneType",),
    ),
    "unpicklable-sample": Example(
        raises="UnpicklableError",
        key_phrases=("sample['meta']['fh']", "_io.TextIOWrapper", "dataset index 0", "Fix:"),
        torch_raises="RuntimeError",
        torch_phrases=("cannot pickle '_io.TextIOWrapper' object", "timed out after 2 seconds"),
    ),
    "sigkill": Example(
        raises="WorkerCrashedError",
        warns=("WorkerRestartedWarning",),
        key_phrases=("SIGKILL", "Dataset index 11 killed its worker 4 times", "on_error='skip'"),
        torch_raises="RuntimeError",
        # torch words it "(pid(s) N) exited unexpectedly" or "(pid N) is killed by signal:
        # Killed.", whichever of its checks sees the death first: only this part is sure.
        torch_phrases=("RuntimeError: DataLoader worker (pid",),
        fixed_warns=("WorkerRestartedWarning",),
    ),
    "stuck": Example(
        raises="WorkerTimeoutError",
        warns=("WorkerStallWarning",),
        key_phrases=("dataset indices [2, 3]", "line 12 in __getitem__", "on_timeout='restart'"),
        fixed_warns=("WorkerStallWarning", "WorkerRestartedWarning"),
    ),
    "which-sample": Example(
        raises="ValueError",
        key_phrases=("during fetch of dataset index 77, in batch 1", 'File "train.py", line 13'),
        torch_raises="ValueError",
        torch_phrases=("Caught ValueError in DataLoader worker process 1",),
    ),
    "big-list": Example(
        raises=None,
        warns=("PreflightWarning",),
        key_phrases=("1,000,000 Python objects", "dataset.paths", "conveyor.SharedList"),
    ),
    "shared-rng": Example(
        raises=None,
        warns=("PreflightWarning",),
        key_phrases=("dataset.rng", "same state in every worker", "default_rng(info.seed)"),
    ),
}


# --- the runner (a subprocess: this file as a script) ----------------------------------------


def parse_page(text: str) -> dict[tuple[str, str], str]:
    """``{(kind, name): block}`` for every marked block of the page."""
    blocks: dict[tuple[str, str], str] = {}
    for kind, name, _lang, body in _BLOCK.findall(text):
        assert (kind, name) not in blocks, f"the page marks {kind}: {name} twice"
        blocks[kind, name] = body
    return blocks


def _run_code(code: str, filename: str) -> dict[str, Any]:
    """Exec ``code`` as a fresh ``__main__``: what it raised, warned and printed.

    ``stderr`` is captured at the file descriptor, so it has what worker processes and
    logging wrote too.
    """
    started = time.perf_counter()
    main = types.ModuleType("__main__")
    saved_main, saved_fd = sys.modules["__main__"], os.dup(2)
    stdout = io.StringIO()
    error: BaseException | None = None
    with tempfile.TemporaryFile("w+") as stderr:
        sys.modules["__main__"] = main
        os.dup2(stderr.fileno(), 2)
        try:
            with warnings.catch_warnings(record=True) as caught, redirect_stdout(stdout):
                warnings.simplefilter("always")
                warnings.simplefilter("ignore", ResourceWarning)  # failing code leaks on purpose
                try:
                    exec(compile(code, filename, "exec"), main.__dict__)
                except Exception as exc:
                    error = exc
                finally:
                    # torch's SIGCHLD handler raises wherever this thread is when a worker
                    # of a loader still alive has died: a late word of the death the
                    # example already reported would end this runner. Held back until the
                    # example's loaders are gone (_hear_late_deaths).
                    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        finally:
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            sys.modules["__main__"] = saved_main
        stderr.seek(0)
        printed = stderr.read()
    lines = [f"{w.category.__name__}: {w.message}" for w in caught]
    if error is not None:
        lines.append(f"{type(error).__name__}: {error}")
        lines += [str(note) for note in getattr(error, "__notes__", None) or ()]
    result = {
        "text": "\n".join(lines),
        "stderr": printed,
        "stdout": stdout.getvalue(),
        "raised": type(error).__name__ if error is not None else None,
        "raised_bases": [c.__name__ for c in type(error).__mro__] if error else [],
        "warned": list(dict.fromkeys(w.category.__name__ for w in caught)),
        "traceback": "".join(traceback.format_exception(error)) if error else "",
    }
    if error is not None:
        traceback.clear_frames(error.__traceback__)
    del error, main, caught
    gc.collect()  # the example's loaders are gone: their workers stop now
    _hear_late_deaths()
    result["seconds"] = time.perf_counter() - started
    return result


def _hear_late_deaths() -> None:
    """Let SIGCHLD through again: torch's handler runs now (pthread_sigmask checks for
    signals before it returns), and its word of a death the example already reported, if
    its loader outlived the collection, is dropped."""
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    except RuntimeError as late:
        if "DataLoader worker" not in str(late):
            raise


def _run_doctor(block: str) -> dict[str, Any]:
    from conveyor.cli import main as conveyor_main

    command = block.splitlines()[0]
    assert command.startswith("$ conveyor doctor "), command
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = conveyor_main(command.split()[2:])
    return {"text": f"{command}\n{stdout.getvalue()}", "exit": code, "stderr": stderr.getvalue()}


def make_files(directory: Path) -> None:
    """The files the page's examples read: rows.db, records.bin and a few text files."""
    with contextlib.closing(sqlite3.connect(directory / "rows.db")) as db, db:
        db.execute("CREATE TABLE rows (id INTEGER PRIMARY KEY, value REAL)")
        db.executemany("INSERT INTO rows VALUES (?, ?)", [(i, i / 2) for i in range(100)])
    (directory / "records.bin").write_bytes(b"".join(i.to_bytes(8, "little") for i in range(1000)))
    docs = directory / "docs"
    docs.mkdir()
    for i in range(8):
        (docs / f"{i}.txt").write_text(f"document {i}\n")


def run_page(page: Path, directory: Path) -> dict[str, dict[str, Any]]:
    """Run every example of ``page`` in ``directory``: ``{"kind:name": result}``."""
    os.chdir(directory)
    sys.path.insert(0, str(directory))
    make_files(directory)
    results: dict[str, dict[str, Any]] = {}
    blocks = parse_page(page.read_text())
    for (kind, name), block in blocks.items():
        if kind == "module":
            (directory / f"{name}.py").write_text(block + "\n")
    for (kind, name), block in blocks.items():
        if kind in ("example", "fixed"):
            results[f"{kind}:{name}"] = _run_code(block, SCRIPT)
        if kind == "example" and ("torch", name) in blocks:
            assert CONVEYOR_IMPORT in block, f"example {name} must import DataLoader from conveyor"
            torch_code = block.replace(CONVEYOR_IMPORT, TORCH_IMPORT)
            results[f"torch:{name}"] = _run_code(torch_code, SCRIPT)
        if kind == "doctor":
            results[f"doctor:{name}"] = _run_doctor(block)
    return results


BLOCKS = parse_page(PAGE.read_text())


def mismatch(quote: str, real: str) -> str | None:
    """The first piece of ``quote`` (split at ``...``) not found in order in ``real``."""
    text = " ".join(real.split())
    position = 0
    for piece in quote.split("..."):
        piece = " ".join(piece.split())
        if not piece:
            continue
        found = text.find(piece, position)
        if found < 0:
            return piece
        position = found + len(piece)
    return None


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    directory = tmp_path_factory.mktemp("troubleshooting")
    out = directory / "results.json"
    work = directory / "work"
    work.mkdir()
    done = subprocess.run(
        [sys.executable, __file__, str(PAGE), str(work), str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=work,
    )
    if done.returncode != 0:
        pytest.fail(f"running the page's examples failed ({done.returncode}):\n{done.stderr}")
    loaded: dict[str, dict[str, Any]] = json.loads(out.read_text())
    return loaded


def _assert_quote(kind: str, name: str, real: dict[str, Any]) -> None:
    """The page's ``kind: name`` quote matches the real run: what it raised and warned
    (after what it wrote to stderr) for messages, stderr and stdout for printed output."""
    if kind == "output":
        where = real["stderr"] + "\n" + real["stdout"]
    elif kind == "doctor":
        where = real["text"]
    else:
        where = real["stderr"] + "\n" + real["text"]
    missing = mismatch(BLOCKS[kind, name], where)
    assert missing is None, (
        f"docs/troubleshooting.md, {kind}: {name}: this part of the quote is not in the real "
        f"output:\n  {missing}\nreal output:\n{where}\n{real.get('traceback', '')}"
    )


def test_every_example_is_in_the_table_and_on_the_page() -> None:
    on_page = {name for kind, name in BLOCKS if kind == "example"}
    assert on_page == set(EXAMPLES), "EXAMPLES and the page's examples differ"
    for name, example in EXAMPLES.items():
        assert ("conveyor", name) in BLOCKS, f"{name}: the page has no conveyor block"
        assert (("fixed", name) in BLOCKS) == example.fixed, f"{name}: fixed block"
        assert (("torch", name) in BLOCKS) == (example.torch_raises is not None), name


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_conveyor_message_is_the_real_one(name: str, results: dict[str, Any]) -> None:
    example, real = EXAMPLES[name], results[f"example:{name}"]
    assert real["raised"] == example.raises, real["traceback"] or real["text"]
    assert real["warned"] == list(example.warns), real["text"]
    quote = " ".join(BLOCKS["conveyor", name].split())
    for phrase in example.key_phrases:
        assert phrase in " ".join(real["text"].split()), f"{name}: {phrase!r} not in the message"
        assert phrase in quote, f"{name}: the page's quote lost {phrase!r}"
    _assert_quote("conveyor", name, real)


@pytest.mark.parametrize("name", [n for n, e in EXAMPLES.items() if e.torch_raises])
def test_torch_message_is_the_real_one(name: str, results: dict[str, Any]) -> None:
    example, real = EXAMPLES[name], results[f"torch:{name}"]
    assert example.torch_raises in real["raised_bases"], real["traceback"]
    assert example.torch_phrases, f"{name}: the table names no phrase of torch's message"
    quote = " ".join(BLOCKS["torch", name].split())
    where = " ".join((real["stderr"] + "\n" + real["text"]).split())
    for phrase in example.torch_phrases:
        assert phrase in where, f"{name}: {phrase!r} not in torch's message"
        assert phrase in quote, f"{name}: the page's torch quote lost {phrase!r}"
    _assert_quote("torch", name, real)


@pytest.mark.parametrize("name", [n for n, e in EXAMPLES.items() if e.fixed])
def test_fixed_code_runs_clean(name: str, results: dict[str, Any]) -> None:
    real = results[f"fixed:{name}"]
    assert real["raised"] is None, real["traceback"]
    assert set(real["warned"]) <= set(EXAMPLES[name].fixed_warns), real["text"]
    if ("output", name) in BLOCKS:
        _assert_quote("output", name, real)


@pytest.mark.parametrize("name", [name for kind, name in BLOCKS if kind == "doctor"])
def test_doctor_output_is_the_real_one(name: str, results: dict[str, Any]) -> None:
    real = results[f"doctor:{name}"]
    _assert_quote("doctor", name, real)
    status = re.search(r"exit status (\d)", BLOCKS["doctor", name])
    assert status is not None and int(status.group(1)) == real["exit"], real["text"]


if __name__ == "__main__":
    page, directory, out = (Path(arg) for arg in sys.argv[1:4])
    out.write_text(json.dumps(run_page(page, directory), indent=1))
