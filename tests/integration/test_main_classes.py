"""Samples, batches and exceptions of classes defined in the training script come back
from the workers as the script's own classes, under every start method.

Spawn and forkserver workers get the script's classes by value (cloudpickle) and do not
run the script; what they send back must still be the main process's ``Point``, ``Box``
and ``BadSample`` (``isinstance`` holds, ``except BadSample`` catches), and the classes
themselves must stay as the script defined them. torch's workers re-import the script
(``if __name__ == "__main__":`` guards it there), so the same script under torch's loader
is the reference; from standard input (``python -``) torch's spawned workers have no
script to import, and only conveyor's run.

Each case runs the script in an interpreter of its own (seconds): ``-m slow``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.interrupts import CHILD_ENV
from tests.helpers.leaks import no_leaks

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(180)]
SCRIPT = Path(__file__).parent / "scripts" / "main_classes.py"
METHODS = ("fork", "spawn", "forkserver")

EXPECTED = {
    "points": [
        {"is_point": True, "x": [0, 1], "y": [0, 1]},
        {"is_point": True, "x": [2, 3], "y": [4, 9]},
    ],
    "boxes": [[[True, 0], [True, 2]]],
    "error": {"caught": True, "describe": "a BadSample"},
    "classes_unchanged": True,
}


def _run(loader: str, method: str, *, stdin: bool = False) -> dict[str, Any]:
    command = [sys.executable, "-" if stdin else str(SCRIPT), loader, method]
    with no_leaks():
        child = subprocess.run(
            command,
            input=SCRIPT.read_text() if stdin else None,
            capture_output=True,
            text=True,
            timeout=150,
            env=CHILD_ENV,
        )
    assert child.returncode == 0, child.stderr
    report: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.parametrize("method", METHODS)
def test_script_classes_come_back_as_torchs_do(method: str) -> None:
    assert _run("torch", method) == EXPECTED  # the reference: torch re-imports the script
    assert _run("conveyor", method) == EXPECTED


@pytest.mark.parametrize("method", METHODS)
def test_classes_of_a_script_read_from_stdin_come_back(method: str) -> None:
    assert _run("conveyor", method, stdin=True) == EXPECTED
