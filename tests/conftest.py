"""Suite-wide collection rules."""

from __future__ import annotations

from pathlib import Path

import pytest

_UNIT = Path(__file__).parent / "unit"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Variants that start real workers with ``spawn`` run with ``-m slow`` (CI runs both
    selections). A spawned worker imports its modules afresh (torch: 1-3 s on two busy
    cores); forkserver variants, in the default run, already cover objects that reach
    the workers pickled. Unit tests keep every variant: they start workers rarely, and
    briefly."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or _UNIT in Path(str(item.path)).parents:
            continue
        if "spawn" in callspec.params.values() or "spawn" in callspec.id.split("-"):
            item.add_marker(pytest.mark.slow)
