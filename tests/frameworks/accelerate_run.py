"""Run by test_accelerate.py, alone or under torchrun: ``accelerate_run.py OUT``.

For accelerate's preparation of torch's loader and conveyor's (through
conveyor.integrations.accelerate.prepare), writes per process: the sample ids each
step saw, whether accelerate synchronised the gradients at each step (gradient
accumulation of 4 over an epoch of 10 batches), and which loader did the loading.
"""

from __future__ import annotations

import json
import sys

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader as TorchDataLoader

from conveyor import DataLoader as ConveyorDataLoader
from conveyor.integrations.accelerate import prepare


class Toy(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 80

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i)])


def epoch(accelerator: Accelerator, loader: object, model: torch.nn.Module) -> dict[str, list]:
    seen, syncs = [], []
    for batch in loader:  # type: ignore[attr-defined]
        with accelerator.accumulate(model):
            seen.append(batch[:, 0].int().tolist())
            syncs.append(accelerator.sync_gradients)
    return {"seen": seen, "syncs": syncs}


if __name__ == "__main__":
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    report = {}
    for name in ("torch", "conveyor"):
        torch.manual_seed(0)
        generator = torch.Generator().manual_seed(1)
        if name == "torch":
            loader = accelerator.prepare(
                TorchDataLoader(Toy(), batch_size=4, shuffle=True, generator=generator)
            )
        else:
            loader = prepare(
                accelerator,
                ConveyorDataLoader(
                    Toy(),
                    batch_size=4,
                    shuffle=True,
                    generator=generator,
                    num_workers=1,
                    on_error="skip",
                    max_worker_restarts=5,
                ),
            )
        report[name] = {
            "epochs": [epoch(accelerator, loader, model) for _ in range(2)],
            "loader": type(loader.base_dataloader).__module__,
            "on_error": getattr(loader.base_dataloader, "on_error", None),
        }
    with open(f"{sys.argv[1]}.{accelerator.process_index}.json", "w") as f:
        json.dump(report, f)
