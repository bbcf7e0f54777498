"""What workers start an epoch with besides its tasks: the training loop's calls on the
dataset (``set_epoch``..., see conveyor._task.dataset_calls) and a DataPipe's shared seed.

Each worker starts with the news as they are when it starts (its spec: a worker started
later, a replacement or one the autotuner adds, gets them too); as each later epoch
starts, the loop sends what changed to every worker before that epoch's tasks
(:meth:`EpochNews.at_epoch_start`), so a worker makes them before its next epoch's first
sample, and never mid-epoch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._task.dataset_calls import Forwarder
from .._task.protocol import EpochMessage, ReplayCalls, SeedPipe
from .._torch.datapipes import SharedSeeds, is_iter_datapipe
from ..config import LoaderConfig

__all__ = ["EpochNews"]


class EpochNews:
    def __init__(self, config: LoaderConfig, draw_base_seed: Callable[[], int]) -> None:
        """Draws the base seed (``draw_base_seed``) where torch draws it: a DataPipe's
        shared seeds are drawn around it; the workers start with the first, the second
        only reseeds the main process's copy."""
        self._config = config
        dataset = config.dataset
        self._pipes = SharedSeeds() if is_iter_datapipe(dataset) else None
        pipes = self._pipes
        self.pipe_seed = pipes.draw(config.generator, dataset) if pipes is not None else None
        self.base_seed = draw_base_seed()
        if pipes is not None:
            pipes.draw(config.generator, dataset)
        self._calls = Forwarder(dataset, config.options.epoch_calls)

    def at_start(self) -> dict[str, Any]:
        """What the workers' specs start with (``WorkerSpec.for_worker``'s ``start``)."""
        return {"pipe_seed": self.pipe_seed, "calls": self._calls.current}

    def at_epoch_start(self) -> list[EpochMessage]:
        """What to send every worker as a later epoch starts: the calls made on the
        dataset since they were last sent (all the last ones), and a DataPipe's new seed."""
        news: list[EpochMessage] = []
        if (calls := self._calls.news()) is not None:
            news.append(ReplayCalls(calls))
        if (pipes := self._pipes) is not None:
            news.append(SeedPipe(pipes.draw(self._config.generator, self._config.dataset)))
        return news
