"""A training script whose loader is built in a *spawned* process (as Lightning's
ddp_spawn and torch.multiprocessing.spawn do), over a dataset class defined here, in
``__main__``: ``python spawned_parent.py WORKER_START_METHOD``."""

from __future__ import annotations

import multiprocessing
import sys

from conveyor import DataLoader


class Squares:
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> int:
        return i * i


def train(method: str, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    loader = DataLoader(Squares(), batch_size=5, num_workers=2, multiprocessing_context=method)
    results.put([b.tolist() for b in loader])


if __name__ == "__main__":
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    rank = context.Process(target=train, args=(sys.argv[1], results))
    rank.start()
    print(results.get(timeout=120))
    rank.join()
    sys.exit(rank.exitcode)
