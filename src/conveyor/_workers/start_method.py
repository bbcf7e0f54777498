"""How worker processes start (fork, spawn or forkserver), as a value."""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from multiprocessing.context import BaseContext

from ..errors import ConfigError

__all__ = ["StartMethod"]


@dataclass(frozen=True)
class StartMethod:
    """How worker processes start, and what follows from it.

    Answers the questions the code used to ask by comparing strings: does the
    child get the parent's memory as it is, must the user's objects be pickled
    to reach it, is a fork server involved.
    """

    name: str  # "fork", "spawn" or "forkserver"

    @classmethod
    def of(cls, context: str | BaseContext | None) -> StartMethod:
        """The start method ``context`` names (None: the platform's default),
        without fixing multiprocessing's global default as a side effect."""
        if isinstance(context, BaseContext):
            return cls(context.get_start_method())
        methods = multiprocessing.get_all_start_methods()
        if context is None:
            # The first of get_all_start_methods() is the platform's default (documented).
            return cls(multiprocessing.get_start_method(allow_none=True) or methods[0])
        if context not in methods:
            raise ConfigError(
                f"multiprocessing_context should be one of {methods}, got {context!r}"
            )
        return cls(context)

    @property
    def copies_memory(self) -> bool:
        """The child starts as a copy of this process: handles and globals are shared."""
        return self.name == "fork"

    @property
    def pickles_objects(self) -> bool:
        """The dataset, collate_fn and worker_init_fn reach the child pickled."""
        return self.name != "fork"

    @property
    def uses_server(self) -> bool:
        """Children are forked by a fork server, not by this process."""
        return self.name == "forkserver"

    def context(self) -> BaseContext:
        return multiprocessing.get_context(self.name)

    def __str__(self) -> str:
        return self.name
