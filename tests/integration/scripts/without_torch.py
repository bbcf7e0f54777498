"""Run with a ``torch`` that cannot be imported first on the path (see the test): conveyor
must load, iterate with and without workers, checkpoint and reseed with NumPy alone."""

from __future__ import annotations

import json
import sys

import numpy as np

import conveyor
from conveyor import DataLoader


class Noisy:
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> tuple[int, float]:
        return i, float(np.random.rand())


def epoch(loader: DataLoader) -> list[list[int]]:
    return [b[0].tolist() for b in loader]


if __name__ == "__main__":
    assert "torch" not in sys.modules
    for method in sys.argv[1:]:
        workers = 0 if method == "inline" else 2
        extra = {} if not workers else {"multiprocessing_context": method}
        loader = DataLoader(
            Noisy(),
            batch_size=4,
            shuffle=True,
            generator=7,
            num_workers=workers,
            reseed="batch",
            **extra,
        )
        batch = next(iter(loader))
        assert isinstance(batch[0], np.ndarray) and isinstance(batch[1], np.ndarray), batch
        it = iter(loader)
        first = next(it)[0].tolist()
        state = json.loads(json.dumps(loader.state_dict()))
        rest = [b[0].tolist() for b in it]
        resumed = DataLoader(
            Noisy(),
            batch_size=4,
            shuffle=True,
            generator=99,
            num_workers=workers,
            reseed="batch",
            **extra,
        )
        resumed.load_state_dict(state)
        assert epoch(resumed) == rest, (method, rest)
        assert sorted(first + [i for batch in rest for i in batch]) == list(range(12))
    assert "torch" not in sys.modules, "conveyor imported torch"
    print("ok", conveyor.__version__)
