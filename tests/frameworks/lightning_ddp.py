"""Run by test_lightning.py: ``python lightning_ddp.py torch|conveyor OUT STRATEGY``.

Trains one epoch of a no-op model on 2 CPU ranks and writes, per rank, the sample
ids its training steps saw and what the loader it trained with looked like.
"""

from __future__ import annotations

import json
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader as TorchDataLoader

from conveyor import DataLoader as ConveyorDataLoader


class Toy(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i)])


class Model(L.LightningModule):
    def __init__(self, loader: str, out: str) -> None:
        super().__init__()
        self.loader, self.out = loader, out
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[int] = []

    def training_step(self, batch: torch.Tensor, index: int) -> torch.Tensor:
        self.seen += batch[:, 0].int().tolist()
        return self.layer(batch).sum()

    def on_train_epoch_end(self) -> None:
        loader = self.trainer.train_dataloader
        report = {
            "rank": self.global_rank,
            "seen": self.seen,
            "module": type(loader).__module__,
            "on_error": getattr(loader, "on_error", None),
            "max_worker_restarts": getattr(loader, "max_worker_restarts", None),
        }
        with open(f"{self.out}.{self.global_rank}.json", "w") as f:
            json.dump(report, f)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def train_dataloader(self) -> TorchDataLoader:  # type: ignore[type-arg]
        if self.loader == "conveyor":
            return ConveyorDataLoader(
                Toy(),
                batch_size=4,
                shuffle=True,
                num_workers=1,
                on_error="skip",
                max_worker_restarts=5,
            )
        return TorchDataLoader(Toy(), batch_size=4, shuffle=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=2,
        strategy=sys.argv[3],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(sys.argv[1], sys.argv[2]))
    # As a training script should: Lightning leaves gloo's process group (and its threads)
    # to the interpreter's exit, where torch 2.14 aborts now and then.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
