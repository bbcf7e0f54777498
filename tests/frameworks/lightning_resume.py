"""Run by test_lightning.py: ``python lightning_resume.py OUT DEVICES [CKPT]``.

Trains 2 epochs on ``DEVICES`` CPU ranks (DDP) with a conveyor loader. Without CKPT, it
saves a checkpoint in the middle of the second epoch (Lightning's own, with the
loader's state) and every rank SIGKILLs itself, as a preempted job; with CKPT it resumes
from that checkpoint (``trainer.fit(ckpt_path=...)``) and finishes. Each rank appends
every training step's sample ids to ``OUT.<run>.<rank>.jsonl`` as it goes.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import lightning as L
import torch

from conveyor import DataLoader

N, BATCH = 96, 4  # 6 steps an epoch on 4 ranks, 12 on 2
STOP_AT = 8  # the 3rd step of the second epoch on 4 ranks


class Toy(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i)])


class Model(L.LightningModule):
    def __init__(self, log: str) -> None:
        super().__init__()
        self.log_path = log
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch: torch.Tensor, index: int) -> torch.Tensor:
        with open(f"{self.log_path}.{self.global_rank}.jsonl", "a") as log:
            step = {"epoch": self.current_epoch, "ids": batch[:, 0].int().tolist()}
            log.write(json.dumps(step) + "\n")
        return self.layer(batch).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Toy(), batch_size=BATCH, shuffle=True, num_workers=1)


class Preempt(L.Callback):
    """Checkpoint after step ``STOP_AT``, then die on every rank, as a preempted job."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == STOP_AT:
            trainer.save_checkpoint(self.path)
            trainer.strategy.barrier()
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    out, devices = sys.argv[1], int(sys.argv[2])
    resume = sys.argv[3] if len(sys.argv) > 3 else None
    run = f"resumed{devices}" if resume else "first"
    torch.manual_seed(0)
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=devices,
        strategy="ddp",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[] if resume else [Preempt(f"{out}.ckpt")],
    )
    trainer.fit(Model(f"{out}.{run}"), ckpt_path=resume)
    if torch.distributed.is_initialized():  # see lightning_ddp.py
        torch.distributed.destroy_process_group()
