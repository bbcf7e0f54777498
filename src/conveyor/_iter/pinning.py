"""``pin_memory=True``: copy a batch's tensors into page-locked memory."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..config import LoaderConfig


def pinning_enabled(config: LoaderConfig) -> bool:
    """Whether batches get pinned; warns as torch does when they cannot be."""
    if not config.pin_memory:
        return False
    try:
        import torch
    except ImportError:
        return False
    if config.pin_memory_device:
        warnings.warn(
            "pin_memory_device is deprecated, the current accelerator will be used as the "
            f"device, ignore pin_memory_device='{config.pin_memory_device}'.",
            stacklevel=4,
        )
    if not torch.accelerator.is_available():
        warnings.warn(
            "'pin_memory' argument is set as true but no accelerator is found, then device "
            "pinned memory won't be used.",
            stacklevel=4,
        )
        return False
    return True


def pin_thread_setup() -> Callable[[], None]:
    """What a pinning thread runs first: use the accelerator the main thread uses now
    (pinned memory is allocated for the current device). Called in the main thread
    once workers run: asking for the device initialises the accelerator."""
    import torch

    device = torch.accelerator.current_device_index()

    def use_device() -> None:
        torch.accelerator.set_device_index(device)

    return use_device


def pin_batch(batch: Any) -> Any:
    try:
        import torch
    except ImportError:
        return batch
    return _pin(batch, torch)


def _pin(data: Any, torch: Any) -> Any:
    if isinstance(data, torch.Tensor):
        return data.pin_memory()
    if isinstance(data, (str, bytes)):
        return data
    if hasattr(data, "pin_memory") and callable(data.pin_memory):
        return data.pin_memory()
    if isinstance(data, Mapping):
        pinned = {k: _pin(v, torch) for k, v in data.items()}
        try:
            return type(data)(pinned)  # type: ignore[call-arg]
        except TypeError:
            return pinned
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_pin(v, torch) for v in data))
    if isinstance(data, tuple):
        return tuple(_pin(v, torch) for v in data)
    if isinstance(data, Sequence):
        items = [_pin(v, torch) for v in data]
        try:
            return type(data)(items)  # type: ignore[call-arg]
        except TypeError:
            return items
    return data
