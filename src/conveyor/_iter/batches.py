"""How many samples a collated batch holds, best effort (for statistics only)."""

from __future__ import annotations

from typing import Any


def batch_size_of(batch: Any) -> int:
    """Samples in a collated batch, best effort (for statistics only)."""
    node = batch
    for _ in range(8):
        if getattr(node, "is_nested", False):  # a nested tensor has no shape: its length
            return int(node.size(0))
        shape = getattr(node, "shape", None)
        if shape is not None:
            return int(shape[0]) if len(shape) else 1
        if isinstance(node, dict) and node:
            node = next(iter(node.values()))
        elif isinstance(node, (list, tuple)) and node:
            if isinstance(node[0], (str, bytes, int, float)):
                return len(node)
            node = node[0]
        else:
            break
    return 1
