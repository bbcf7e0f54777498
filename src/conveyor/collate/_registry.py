"""The collate registries: torch's ``default_collate_fn_map`` and conveyor's own.

torch's ``collate`` looks the type of a batch's first element up in a map of
collate functions before its container rules: the exact type first, then
``isinstance`` against every key in insertion order; the function found is
called as ``fn(batch, collate_fn_map=the_map)``. :class:`Dispatch` is that
lookup, its answer cached per type. conveyor's ``default_collate`` looks up in
one merged list (:meth:`Registries.both`): torch's map when torch is loaded,
with conveyor's entries laid over it (see docs/design.md, "Collate registries").
A default function, torch's or conveyor's, stands for conveyor's built-in rule
of the same name (:class:`Rule`): same result, faster, errors explained.

When both maps hold only their defaults, ``both()`` returns None and collate
takes its built-in path with no lookup at all; knowing that costs one dict
comparison per map and batch, not one lookup per element.

Workers get the main process's maps as they were at ``iter()``
(:meth:`Registries.snapshot`, sent with the ``collate_fn``;
:meth:`Registries.carry_in` in the worker): a registration made in ``__main__``
or a notebook reaches spawn and forkserver workers, which do not run
``__main__`` again.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

CollateFnMap = dict[Any, Callable[..., Any]]


class Rule(enum.Enum):
    """conveyor's built-in rules for leaves, named after torch's default functions."""

    TENSOR = "collate_tensor_fn"
    ARRAY = "collate_numpy_array_fn"
    SCALAR = "collate_numpy_scalar_fn"
    FLOAT = "collate_float_fn"
    INT = "collate_int_fn"
    STR = "collate_str_fn"


@dataclass(frozen=True, slots=True)
class Call:
    """A user's function: called as ``fn(batch, collate_fn_map=collate_fn_map)``."""

    fn: Callable[..., Any]
    collate_fn_map: Mapping[Any, Any]
    key: Any  # the entry it was found under (for error notes)


Action = Rule | Call | None  # None: no entry matches; the container rules apply

_MISS: Any = object()


class Dispatch:
    """torch's lookup over one ordered list of entries, remembered per element type."""

    __slots__ = ("_cache", "_entries", "_exact", "tensor_custom")

    def __init__(self, entries: list[tuple[Any, Action]], tensor_type: type | None) -> None:
        self._entries = entries
        self._exact = dict(entries)
        self._cache: dict[type, Action] = {}
        # torch's rule for NumPy arrays makes tensors and collates them through the
        # map again: only a function for tensors other than the default one sees them.
        try:
            custom = tensor_type is not None and self._for_type(tensor_type) is not Rule.TENSOR
        except TypeError:  # a key isinstance refuses: let the lookup itself raise, as torch's
            custom = True
        self.tensor_custom = custom

    def action(self, elem: Any) -> Action:
        kind = type(elem)
        action = self._cache.get(kind, _MISS)
        if action is _MISS:
            action = self._exact.get(kind, _MISS)
            if action is _MISS:
                action = next((a for key, a in self._entries if isinstance(elem, key)), None)
            if elem.__class__ is kind:  # else isinstance may depend on the object itself
                self._cache[kind] = action
        return action

    def _for_type(self, kind: type) -> Action:
        action = self._exact.get(kind, _MISS)
        if action is _MISS:
            action = next((a for key, a in self._entries if issubclass(kind, key)), None)
        return action


@dataclass(frozen=True)
class Registrations:
    """Both maps' entries, in order, as the main process had them at ``iter()``.

    Nothing here names torch unless a registration does: torch's map is left out
    while it holds only its defaults, and conveyor's default entry for tensors (its
    first) is added back where torch is loaded. A worker that needs no torch (a NumPy
    pipeline with ``numpy_collate``) does not import it for the registrations.
    """

    torch_items: tuple[tuple[Any, Callable[..., Any]], ...] | None  # None: torch's defaults
    own_items: tuple[tuple[Any, Callable[..., Any]], ...]
    own_tensor_first: bool = False  # own_items leave out the default first entry for tensors


@dataclass(frozen=True)
class _Seen:
    """The maps a dispatch was built from (copies), to tell when they change."""

    torch: CollateFnMap | None
    own: dict[Any, Any]
    token: object  # abc's cache token: a new virtual subclass changes isinstance
    dispatch: Dispatch | None  # None: the built-in rules alone give the same result
    merged: Mapping[Any, Any] | None = None  # what conveyor's functions are given


_NEVER = _Seen(None, {_MISS: _MISS}, None, None)  # equals no map: the first call builds


class Registries:
    """conveyor's map (``own``), torch's once loaded, and the dispatches they make."""

    def __init__(self, own: CollateFnMap, tensor_fn: Callable[..., Any]) -> None:
        self.own = own
        self._tensor_fn = tensor_fn
        self._own_defaults = dict(own)  # conveyor's default entries, as the module made them
        self._rules: dict[Any, Rule] = {fn: Rule(fn.__name__) for fn in (tensor_fn, *own.values())}
        self._torch_map: CollateFnMap | None = None
        self._tensor_type: type | None = None
        self._carried = False  # the maps were replaced by the main process's
        self._both = _NEVER
        self._own_only = _NEVER
        self._given: dict[int, tuple[Mapping[Any, Any], CollateFnMap, object, Dispatch | None]]
        self._given = {}

    def adopt_torch(self, torch: Any) -> None:
        """torch is loaded: honour its map; conveyor's gains an entry for tensors."""
        from torch.utils.data._utils import collate as torch_collate

        for rule in Rule:
            fn = getattr(torch_collate, rule.value, None)
            if fn is not None:
                self._rules[fn] = rule
        self._tensor_type = torch.Tensor
        self._own_defaults = {torch.Tensor: self._tensor_fn, **self._own_defaults}
        if not self._carried and torch.Tensor not in self.own:
            # First, as in the main process's map (and in torch's).
            entries = dict(self.own)
            self.own.clear()
            self.own.update({torch.Tensor: self._tensor_fn, **entries})
        self._torch_map = torch_collate.default_collate_fn_map
        self._both = self._own_only = _NEVER

    # --- the dispatch for a batch -----------------------------------------------------

    def both(self) -> Dispatch | None:
        """default_collate's dispatch: torch's map with conveyor's laid over it; None
        when every entry is a default one in its default place."""
        seen = self._both
        if (
            self._torch_map == seen.torch
            and self.own == seen.own
            and (seen.dispatch is None or abc.get_cache_token() == seen.token)
        ):
            return seen.dispatch
        self._both = seen = self._build(self._torch_map)
        return seen.dispatch

    def own_only(self) -> Dispatch | None:
        """numpy_collate's dispatch: conveyor's map alone (torch's functions make tensors)."""
        seen = self._own_only
        if self.own == seen.own and (seen.dispatch is None or abc.get_cache_token() == seen.token):
            return seen.dispatch
        self._own_only = seen = self._build(None)
        return seen.dispatch

    def given(self, collate_fn_map: Mapping[Any, Any] | None) -> Dispatch | None:
        """The dispatch of ``collate(batch, collate_fn_map=...)``: that map's entries."""
        if collate_fn_map is None:
            return _CONTAINERS_ONLY
        both = self.both()
        if both is not None and collate_fn_map is self._both.merged:
            return both  # what conveyor's functions were given: default_collate's own
        token = abc.get_cache_token()
        known = self._given.get(id(collate_fn_map))
        if (
            known is not None
            and known[0] is collate_fn_map
            and known[1] == collate_fn_map
            and (known[3] is None or known[2] == token)
        ):
            return known[3]
        items = list(collate_fn_map.items())
        dispatch = self._dispatch(items, dict.fromkeys(collate_fn_map, collate_fn_map))
        if len(self._given) >= 16:
            self._given.clear()
        self._given[id(collate_fn_map)] = (collate_fn_map, dict(items), token, dispatch)
        return dispatch

    def _build(self, torch_map: CollateFnMap | None) -> _Seen:
        token = abc.get_cache_token()
        own = dict(self.own)
        if torch_map is None:
            dispatch = self._dispatch(list(own.items()), dict.fromkeys(own, self.own))
            return _Seen(None, own, token, dispatch, self.own)
        merged = dict(torch_map)
        passed: dict[Any, Mapping[Any, Any]] = dict.fromkeys(merged, torch_map)
        for key, fn in own.items():
            if self._own_defaults.get(key, _MISS) is fn:
                continue  # conveyor's default entry: torch's own entry stands
            merged[key] = fn
            passed[key] = merged  # conveyor's functions are given both maps' entries
        dispatch = self._dispatch(list(merged.items()), passed)
        return _Seen(dict(torch_map), own, token, dispatch, merged)

    def _dispatch(
        self, items: list[tuple[Any, Any]], passed: Mapping[Any, Mapping[Any, Any]]
    ) -> Dispatch | None:
        entries: list[tuple[Any, Action]] = []
        for key, fn in items:
            try:
                rule = self._rules.get(fn)
            except TypeError:  # an unhashable callable: the user's
                rule = None
            entries.append((key, rule if rule is not None else Call(fn, passed[key], key)))
        default = [(key, self._rules[fn]) for key, fn in self._own_defaults.items()]
        return None if entries == default else Dispatch(entries, self._tensor_type)

    # --- crossing into workers --------------------------------------------------------

    def snapshot(self) -> Registrations | None:
        """The maps to send to workers, or None when both hold only their defaults."""
        if self.both() is None and self.own_only() is None:
            return None
        torch_map = self._torch_map
        torch_items = None
        if torch_map is not None and not self._at_defaults(torch_map):
            torch_items = tuple(torch_map.items())
        own_items = tuple(self.own.items())
        tensor_first = bool(own_items) and own_items[0] == (self._tensor_type, self._tensor_fn)
        if tensor_first:
            own_items = own_items[1:]
        return Registrations(torch_items, own_items, tensor_first)

    def _at_defaults(self, collate_fn_map: CollateFnMap) -> bool:
        items = list(collate_fn_map.items())
        return self._dispatch(items, dict.fromkeys(collate_fn_map, collate_fn_map)) is None

    def carry_in(self, registrations: Registrations) -> None:
        """In a worker: make both maps the main process's (torch's is left as it is
        when the main process's held only torch's defaults)."""
        if registrations.torch_items is not None:
            from torch.utils.data._utils import collate as torch_collate

            torch_map = torch_collate.default_collate_fn_map
            torch_map.clear()
            torch_map.update(registrations.torch_items)
        entries = dict(registrations.own_items)
        if registrations.own_tensor_first and self._tensor_type is not None:
            entries = {self._tensor_type: self._tensor_fn, **entries}
        self.own.clear()
        self.own.update(entries)
        # Without torch loaded yet, adopt_torch adds the entry for tensors back, first.
        self._carried = not registrations.own_tensor_first
        self._both = self._own_only = _NEVER


_CONTAINERS_ONLY = Dispatch([], None)  # collate(batch) without a map: torch's containers only
