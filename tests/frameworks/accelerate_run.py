"""Run by test_accelerate.py, alone or under torchrun: ``accelerate_run.py OUT``.

Prepares one loader four ways and writes, per process and per way: the sample ids each
step saw, whether accelerate synchronised the gradients at each step (gradient
accumulation of 4 over an epoch of 10 batches), which loader did the loading, and the
warnings of conveyor's that preparing and the epochs gave:

- ``torch``: torch's loader, through accelerate's ``prepare`` (the reference);
- ``function``: a conveyor loader through ``conveyor.integrations.accelerate.prepare``;
- ``subclass``: a conveyor loader through ``accelerator.prepare(model, optimizer, loader)``,
  the accelerator being conveyor's ``Accelerator``;
- ``torch_skipped``, ``subclass_skipped``: the third epoch of those two loaders, through
  ``accelerator.skip_first_batches(loader, 3)``;
- ``plain``: a conveyor loader through accelerate's own ``Accelerator.prepare``, which
  replaces it with torch's loader (conveyor warns).
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

import accelerate
import torch
from torch.utils.data import DataLoader as TorchDataLoader

from conveyor import DataLoader as ConveyorDataLoader
from conveyor.integrations.accelerate import Accelerator, prepare


class Toy(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 80

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i)])


def epoch(accelerator: Any, loader: object, model: torch.nn.Module) -> dict[str, list]:
    seen, syncs = [], []
    for batch in loader:  # type: ignore[attr-defined]
        with accelerator.accumulate(model):
            seen.append(batch[:, 0].int().tolist())
            syncs.append(accelerator.sync_gradients)
    return {"seen": seen, "syncs": syncs}


def conveyor_loader(generator: torch.Generator) -> ConveyorDataLoader:
    return ConveyorDataLoader(
        Toy(),
        batch_size=4,
        shuffle=True,
        generator=generator,
        num_workers=1,
        on_error="skip",
        max_worker_restarts=5,
    )


def prepared(way: str, accelerator: Any, plain: Any, model: torch.nn.Module) -> Any:
    generator = torch.Generator().manual_seed(1)
    if way == "torch":
        loader = TorchDataLoader(Toy(), batch_size=4, shuffle=True, generator=generator)
        return accelerator.prepare(loader)
    if way == "function":
        return prepare(accelerator, conveyor_loader(generator))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if way == "subclass":
        return accelerator.prepare(model, optimizer, conveyor_loader(generator))[2]
    return plain.prepare(model, optimizer, conveyor_loader(generator))[2]


def _kind(x: Any) -> str:
    return f"{type(x).__module__}.{type(x).__qualname__}"


def describe(loader: Any) -> dict[str, Any]:
    """Which loader loads, and what code reads of the prepared one (docs/frameworks.md)."""
    base = getattr(loader, "base_dataloader", loader)
    shard = loader.batch_sampler
    sharded = getattr(shard, "batch_sampler", None)
    return {
        "loader": type(base).__module__,
        "on_error": getattr(base, "on_error", None),
        "seen_as": {
            "batch_size": loader.batch_size,
            "total_batch_size": getattr(loader, "total_batch_size", None),
            "drop_last": loader.drop_last,
            "len": len(loader),
            "sampler": _kind(loader.sampler),
            "batch_sampler": _kind(shard),
            "sharded": _kind(sharded),
            "sharded_sampler": _kind(getattr(sharded, "sampler", None)),
        },
    }


if __name__ == "__main__":
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    plain = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=4)
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    report: dict[str, Any] = {}
    for way in ("torch", "function", "subclass", "plain"):
        torch.manual_seed(0)
        with warnings.catch_warnings(record=True) as caught:  # preparing, and the epochs
            warnings.simplefilter("always")
            loader = prepared(way, accelerator, plain, torch.nn.Linear(1, 1))
            epochs = [epoch(accelerator, loader, model) for _ in range(2)]
        report[way] = {
            "epochs": epochs,
            **describe(loader),
            "warnings": [
                {
                    "category": w.category.__name__,
                    "message": str(w.message),
                    "filename": w.filename,
                }
                for w in caught
                if w.category.__module__.startswith("conveyor")
            ],
        }
        if way in ("torch", "subclass"):  # resuming an epoch: its first 3 batches skipped
            skipped = accelerator.skip_first_batches(loader, 3)
            report[f"{way}_skipped"] = {
                "epochs": [epoch(accelerator, skipped, model)],
                **describe(skipped),
            }
    with open(f"{sys.argv[1]}.{accelerator.process_index}.json", "w") as f:
        json.dump(report, f)
