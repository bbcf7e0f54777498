"""Run by test_accelerate.py under torchrun: ``accelerate_resume.py OUT first|resume``.

conveyor's ``Accelerator`` with ``use_stateful_dataloader=True`` (no torchdata needed).
``first``: train 3 steps of the first epoch, ``accelerator.save_state(OUT.ckpt)``, keep
each process's own loader state beside it, then every process SIGKILLs itself (a
preempted job). ``resume``: put the last process's state where accelerate looks for it
(whichever process wrote last, its state must do), ``load_state``, finish the epoch.
Each process appends every step's sample ids to ``OUT.<phase>.<rank>.jsonl``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path

import torch
from accelerate.utils import DataLoaderConfiguration

from conveyor import DataLoader
from conveyor.integrations.accelerate import Accelerator

N, STEPS = 96, 3


class Toy(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i)])


def main(out: str, phase: str) -> None:
    stateful = DataLoaderConfiguration(use_stateful_dataloader=True)
    accelerator = Accelerator(cpu=True, dataloader_config=stateful)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    loader = DataLoader(Toy(), batch_size=4, shuffle=True, num_workers=1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    rank, ckpt = accelerator.process_index, Path(f"{out}.ckpt")
    log = open(f"{out}.{phase}.{rank}.jsonl", "a")  # noqa: SIM115 (written step by step)
    if phase == "resume":
        if accelerator.is_main_process:  # the last old process's state, found there
            kept = sorted(ckpt.parent.glob(f"{ckpt.name}.loader.*.bin"))[-1]
            shutil.copy(kept, ckpt / "dl_state_dict.bin")
        accelerator.wait_for_everyone()
        accelerator.load_state(str(ckpt))
    for step, batch in enumerate(loader):
        log.write(json.dumps(batch[:, 0].int().tolist()) + "\n")
        log.flush()
        if phase == "first" and step + 1 == STEPS:
            accelerator.save_state(str(ckpt))
            torch.save(loader.state_dict(), f"{ckpt}.loader.{rank}.bin")
            accelerator.wait_for_everyone()
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
