"""Frameworks (Lightning, accelerate, data libraries) with conveyor's loader."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a framework's own process (torchrun, Lightning's ranks): the
    repository's root on the path (the scripts import ``tests.frameworks``), and the
    entries of this run's own ``PYTHONPATH`` (a checkout's ``src``) kept after it."""
    path = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), **extra}
