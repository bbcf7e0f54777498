"""Functions registered in ``default_collate_fn_map`` give torch's batches, with and
without workers, under every start method.

Each case registers functions in torch's map, conveyor's, or both, runs torch's
DataLoader with the registration torch would see (conveyor's entries laid over
torch's, as conveyor does), then conveyor's with the real registration, and
compares every batch. torch's reference runs in-process or under fork: its
spawned workers do not see a registration made in the main process, and
conveyor's do (the maps travel with the collate function).
"""

from __future__ import annotations

import collections.abc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader as TorchDataLoader  # noqa: E402
from torch.utils.data._utils import collate as torch_collate  # noqa: E402

import conveyor  # noqa: E402
import conveyor.collate  # noqa: E402
from tests.helpers.collate_maps import restored_collate_maps  # noqa: E402

from . import registered as reg  # noqa: E402
from .test_torch_parity import assert_batches_equal, seed_everything  # noqa: E402

pytestmark = [pytest.mark.torch]

TORCH_MAP = torch_collate.default_collate_fn_map
OWN_MAP = conveyor.collate.default_collate_fn_map


@dataclass(frozen=True)
class Registration:
    torch: dict[Any, Callable[..., Any]] = field(default_factory=dict)
    conveyor: dict[Any, Callable[..., Any]] = field(default_factory=dict)
    removed: tuple[Any, ...] = ()  # keys taken out of torch's map

    def as_torch_sees_it(self) -> None:
        for key in self.removed:
            del TORCH_MAP[key]
        TORCH_MAP.update({**self.torch, **self.conveyor})

    def as_made(self) -> None:
        for key in self.removed:
            del TORCH_MAP[key]
        TORCH_MAP.update(self.torch)
        OWN_MAP.update(self.conveyor)


REGISTRATIONS = {
    "torch-type": Registration(torch={reg.Box: reg.collate_boxes}),
    "torch-type-numpy-out": Registration(torch={reg.Box: reg.collate_boxes_numpy}),
    "torch-float": Registration(torch={reg.Box: reg.collate_boxes, float: reg.collate_float32}),
    "torch-tensor": Registration(
        torch={reg.Box: reg.collate_boxes, torch.Tensor: reg.collate_tensors_counted}
    ),
    "torch-mapping-abc": Registration(torch={collections.abc.Mapping: reg.collate_mappings}),
    "torch-object": Registration(torch={object: reg.collate_objects}),
    "torch-bytes-removed": Registration(
        torch={reg.Box: reg.collate_boxes_labels}, removed=(bytes,)
    ),
    "conveyor-type": Registration(conveyor={reg.Box: reg.collate_boxes}),
    "conveyor-over-torch": Registration(
        torch={reg.Box: reg.collate_boxes_numpy, float: reg.collate_float32},
        conveyor={reg.Box: reg.collate_boxes, reg.SubBox: reg.collate_boxes_labels},
    ),
}

# Every registration in-process, under fork and in thread workers; a few under forkserver
# and spawn, where what is new is how the maps reach the workers (spawned workers import
# torch: slow).
METHODS = {
    "inline": list(REGISTRATIONS),
    "fork": list(REGISTRATIONS),
    "thread": list(REGISTRATIONS),  # worker_method="thread": the training process's maps
    "forkserver": ["torch-type-numpy-out", "torch-float", "conveyor-type"],
    "spawn": ["torch-type-numpy-out", "torch-tensor", "torch-bytes-removed", "conveyor-over-torch"],
}


@pytest.fixture
def collate_maps() -> Iterator[Callable[[], None]]:
    with restored_collate_maps() as restore:
        yield restore


def _batches(loader: Any) -> list[Any]:
    seed_everything()
    return list(loader)


@pytest.mark.parametrize(
    ("method", "name"),
    [(method, name) for method, names in METHODS.items() for name in names],
)
def test_registered_functions_give_torchs_batches(
    method: str, name: str, collate_maps: Callable[[], None]
) -> None:
    registration = REGISTRATIONS[name]
    workers: dict[str, Any] = {} if method == "inline" else {"num_workers": 2}
    registration.as_torch_sees_it()
    fork = {"multiprocessing_context": "fork"} if workers else {}
    expected = _batches(TorchDataLoader(reg.BoxDataset(), batch_size=4, **workers, **fork))
    collate_maps()
    registration.as_made()
    context = {"multiprocessing_context": method} if workers else {}
    if method == "thread":
        context = {"worker_method": "thread"}
    got = _batches(conveyor.DataLoader(reg.BoxDataset(), batch_size=4, **workers, **context))
    assert len(got) == len(expected) == 3
    for i, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
        assert_batches_equal(ours, theirs, f"batch {i}")
