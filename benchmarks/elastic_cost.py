"""What resuming on another number of ranks costs: a state's size, ``state_dict()``,
``conveyor.merge_states`` of every rank's state, and the new rank's first ``iter()``
(the epoch order drawn again and the rest dealt).

``python benchmarks/elastic_cost.py [--ranks 1024] [--samples 1281167]``: an ImageNet-
sized epoch on 1,024 ranks, resumed on 512. One loader is run for real (rank 0, a few
steps); the other ranks' states are rank 0's with their own rank (what lockstep ranks
write), so the merge does all the work a real one would.
"""

from __future__ import annotations

import argparse
import copy
import json
import time

from conveyor import DataLoader, DistributedSampler, merge_states


class Indices:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _loader(n: int, world: int, rank: int, batch: int) -> DataLoader:
    sampler = DistributedSampler(Indices(n), num_replicas=world, rank=rank, seed=3)
    sampler.set_epoch(5)
    return DataLoader(Indices(n), batch_size=batch, sampler=sampler)


def _timed(what: str, run: object) -> object:
    began = time.perf_counter()
    result = run()  # type: ignore[operator]
    print(f"{what}: {(time.perf_counter() - began) * 1e3:,.1f} ms")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--samples", type=int, default=1_281_167)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    loader = _loader(args.samples, args.ranks, 0, args.batch)
    it = iter(loader)
    for _ in range(args.steps):
        next(it)
    state = _timed("state_dict() of one rank", loader.state_dict)
    text = json.dumps(state)
    print(f"state size: {len(text):,} bytes of JSON")
    states = []
    for rank in range(args.ranks):
        other = copy.deepcopy(state)
        other["conveyor"]["ranks"]["rank"] = rank
        states.append(other)
    merged = _timed(f"merge_states() of {args.ranks:,} ranks' states", lambda: merge_states(states))
    print(f"merged state size: {len(json.dumps(merged)):,} bytes of JSON")
    new = _loader(args.samples, args.ranks // 2, 1, args.batch)
    new.load_state_dict(merged)
    first = _timed(
        f"iter() + first batch on rank 1 of {args.ranks // 2:,}", lambda: next(iter(new))
    )
    print(f"first batch resumed: {list(first)[:4]}...")  # type: ignore[call-overload]


if __name__ == "__main__":
    main()
