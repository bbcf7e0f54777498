"""Objects known to draw from torch's global generator, which thread workers share.

torch has one default CPU generator per process: ``torch.rand``, ``torch.randint``,
``Tensor.uniform_`` and their kin draw from it unless given ``generator=``. Thread
workers (and the threads of a ``threads_per_worker`` process) cannot each have their
own, as they do for ``random`` and NumPy's module functions (conveyor._workers.thread_draws):
torch's functions reach it in C++. So what draws from it is named before the threads
start (a warning at construction, ``conveyor.check``, ``conveyor doctor``).

Recognised, by class (subclasses included), never by guess: torchvision's random
transforms, v1 (``torchvision.transforms``) and v2 (``torchvision.transforms.v2``), each
listed below because its source draws from torch's global generator (read in
torchvision 0.29.1). v1's ``RandomChoice`` and ``RandomOrder`` draw from ``random``,
which is per thread already. torch plans for torchvision to draw from the thread
worker's own generator (``get_worker_info().rng``): whether a family still draws from
the global one is checked once per process, by drawing a flip in a stand-in thread
worker and seeing which generator moved, so the warning stops where it no longer holds.
torchvision is never imported here: only a program that has it loaded holds its objects.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any

__all__ = ["torch_draw_of"]

# Public module -> the classes whose source draws from torch's global generator.
_FAMILIES: dict[str, tuple[str, ...]] = {
    "torchvision.transforms": (
        "AugMix", "AutoAugment", "ColorJitter", "ElasticTransform", "GaussianBlur",
        "RandAugment", "RandomAdjustSharpness", "RandomAffine", "RandomApply",
        "RandomAutocontrast", "RandomCrop", "RandomEqualize", "RandomErasing",
        "RandomGrayscale", "RandomHorizontalFlip", "RandomInvert", "RandomPerspective",
        "RandomPosterize", "RandomResizedCrop", "RandomRotation", "RandomSolarize",
        "RandomVerticalFlip", "TrivialAugmentWide",
    ),
    "torchvision.transforms.v2": (
        "AugMix", "AutoAugment", "ColorJitter", "CutMix", "ElasticTransform", "GaussianBlur",
        "GaussianNoise", "JPEG", "MixUp", "RandAugment", "RandomAdjustSharpness",
        "RandomAffine", "RandomApply", "RandomAutocontrast", "RandomChannelPermutation",
        "RandomChoice", "RandomCrop", "RandomEqualize", "RandomErasing", "RandomGrayscale",
        "RandomHorizontalFlip", "RandomInvert", "RandomIoUCrop", "RandomOrder",
        "RandomPerspective", "RandomPhotometricDistort", "RandomPosterize", "RandomResize",
        "RandomResizedCrop", "RandomRotation", "RandomShortestSize", "RandomSolarize",
        "RandomVerticalFlip", "RandomZoomOut", "ScaleJitter", "TrivialAugmentWide",
    ),
}  # fmt: skip
_PROBE = "RandomHorizontalFlip"  # drawn once per family: which generator does it move?
_lock = threading.Lock()
_still_global: dict[str, bool] = {}  # family -> its probe's answer, once per process


def torch_draw_of(kind: type) -> str | None:
    """What objects of ``kind`` are, if they draw from torch's global generator in thread
    workers (``"torchvision.transforms.v2.RandomCrop"``, ``"a subclass of ..."``); else
    None."""
    if "torchvision" not in sys.modules:
        return None
    for family, names in _FAMILIES.items():
        module = sys.modules.get(family)
        if module is None:
            continue
        for base in kind.__mro__:
            name = getattr(base, "__name__", "")
            if name in names and getattr(module, name, None) is base:
                if not _draws_from_global(family, module):
                    return None
                public = f"{family}.{name}"
                return public if base is kind else f"a subclass of {public}"
    return None


def _draws_from_global(family: str, module: Any) -> bool:
    with _lock:
        if family not in _still_global:
            _still_global[family] = _probe(module)
        return _still_global[family]


def _probe(module: Any) -> bool:
    """Flip a one-pixel image in a stand-in thread worker: True if torch's global
    generator moved (or the probe could not run: what the source says then holds)."""
    from .._workers import scope as _scope
    from ..worker_info import WorkerInfo, install_in_torch

    torch = sys.modules.get("torch")
    if torch is None:
        return True
    scope = _scope.WorkerScope(owns_globals=False)
    scope.info = WorkerInfo(0, 1, 0, None, scope.rng, "thread")
    install_in_torch(scope, process_wide=False)
    before = torch.default_generator.get_state()
    try:
        with _scope.entered(scope), contextlib.suppress(Exception):
            getattr(module, _PROBE)(p=0.5)(torch.zeros(1, 1, 1))
            return not torch.equal(torch.default_generator.get_state(), before)
        return True
    finally:
        torch.default_generator.set_state(before)
