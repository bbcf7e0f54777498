"""What ``import conveyor`` offers, and that it matches torch's names where it should."""

from __future__ import annotations

import inspect

import pytest

import conveyor

TORCH_NAMES = [
    "DataLoader", "get_worker_info", "default_collate", "default_convert", "SequentialSampler",
    "RandomSampler", "SubsetRandomSampler", "BatchSampler", "WeightedRandomSampler",
]  # fmt: skip


def test_all_lists_exactly_the_public_names():
    public = {n for n in dir(conveyor) if not n.startswith("_")}
    modules = {n for n in public if inspect.ismodule(getattr(conveyor, n))}
    assert set(conveyor.__all__) == public - modules


@pytest.mark.parametrize("name", TORCH_NAMES)
def test_torch_names_are_exported(name):
    assert name in conveyor.__all__


@pytest.mark.parametrize("name", ["DataLoader", "RandomSampler", "BatchSampler"])
def test_signatures_match_torch(name):
    torch_data = pytest.importorskip("torch.utils.data")
    ours = list(inspect.signature(getattr(conveyor, name)).parameters.values())
    theirs = list(inspect.signature(getattr(torch_data, name)).parameters.values())
    assert [(p.name, p.kind, p.default) for p in ours[: len(theirs)]] == [
        (p.name, p.kind, p.default) for p in theirs
    ]
    # conveyor's own options come after torch's, keyword-only, with defaults.
    for extra in ours[len(theirs) :]:
        assert extra.kind is inspect.Parameter.KEYWORD_ONLY, extra
        assert extra.default is not inspect.Parameter.empty, extra


def test_dataloader_can_be_subscripted_in_annotations_like_torchs() -> None:
    import types

    from conveyor import DataLoader

    alias = DataLoader[int]
    assert isinstance(alias, types.GenericAlias)
    assert alias.__origin__ is DataLoader and alias.__args__ == (int,)
