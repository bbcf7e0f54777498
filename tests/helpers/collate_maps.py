"""Put torch's and conveyor's collate registries back as they were after a test.

Both maps are process-wide: a registration a test leaves behind would change
every later test's batches.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import conveyor.collate


def live_maps() -> list[dict[Any, Any]]:
    """conveyor's map, and torch's when torch is loaded."""
    maps = [conveyor.collate.default_collate_fn_map]
    if "torch" in sys.modules:
        from torch.utils.data._utils.collate import default_collate_fn_map

        maps.append(default_collate_fn_map)
    return maps


@contextlib.contextmanager
def restored_collate_maps() -> Iterator[Callable[[], None]]:
    """Yields ``restore()``, which puts both maps back now; it runs again at the end."""
    saved = [(live, dict(live)) for live in live_maps()]

    def restore() -> None:
        for live, before in saved:
            live.clear()
            live.update(before)

    try:
        yield restore
    finally:
        restore()
