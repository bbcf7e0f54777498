"""What ``import conveyor`` offers, and that it matches torch's names where it should."""

from __future__ import annotations

import inspect
import re

import pytest

import conveyor

TORCH_NAMES = [
    "DataLoader", "get_worker_info", "default_collate", "default_convert", "SequentialSampler",
    "RandomSampler", "SubsetRandomSampler", "BatchSampler", "WeightedRandomSampler",
    "DistributedSampler",
]  # fmt: skip


def test_all_lists_exactly_the_public_names():
    public = {n for n in dir(conveyor) if not n.startswith("_")}
    modules = {n for n in public if inspect.ismodule(getattr(conveyor, n))}
    assert set(conveyor.__all__) == public - modules


@pytest.mark.parametrize("name", TORCH_NAMES)
def test_torch_names_are_exported(name):
    assert name in conveyor.__all__


@pytest.mark.parametrize(
    "name", ["DataLoader", "RandomSampler", "BatchSampler", "DistributedSampler"]
)
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


def test_a_torch_dataloader_to_isinstance_checks_and_to_frameworks_reading_attributes() -> None:
    """Frameworks decide by isinstance, and rebuild a loader from the attributes named
    like its parameters: conveyor's options must be among them."""
    torch = pytest.importorskip("torch")
    loader = conveyor.DataLoader(
        list(range(8)), batch_size=2, shuffle=True, on_error="skip", reseed="batch"
    )
    assert isinstance(loader, torch.utils.data.DataLoader)
    assert isinstance(loader.sampler, torch.utils.data.RandomSampler)
    assert isinstance(loader.batch_sampler, torch.utils.data.BatchSampler)
    parameters = inspect.signature(conveyor.DataLoader.__init__).parameters
    for name in conveyor.DataLoader.conveyor_options:
        assert name in parameters
    rebuilt = type(loader)(
        loader.dataset,
        batch_size=loader.batch_size,
        **{name: getattr(loader, name) for name in conveyor.DataLoader.conveyor_options},
    )
    assert (rebuilt.on_error, rebuilt.reseed) == ("skip", "batch")
    loader.on_error = "raise"  # torch lets attributes change; the config follows
    assert loader._config.policy.on_error == "raise"
    with pytest.raises(ValueError, match="on_error must be one of"):
        loader.on_error = "ignore"


def _conveyor_exception_classes() -> set[type]:
    """Every exception and warning class conveyor defines, in any of its modules."""
    import contextlib
    import importlib
    import pkgutil

    for module in pkgutil.walk_packages(conveyor.__path__, "conveyor."):
        with contextlib.suppress(ImportError):  # an optional dependency (Pillow) is missing
            importlib.import_module(module.name)  # its classes: __subclasses__ sees them
    found: set[type] = set()
    todo: list[type] = [conveyor.ConveyorError, conveyor.ConveyorWarning]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("conveyor") and not cls.__name__.startswith("_"):
            found.add(cls)
        todo += cls.__subclasses__()
    return found


def test_every_exception_a_user_can_catch_is_in_conveyor_errors_and_its_tree():
    from conveyor import errors

    classes = _conveyor_exception_classes()
    assert len(classes) > 20
    tree = errors.__doc__ or ""
    for cls in classes:
        where = f"{cls.__module__}.{cls.__qualname__}"
        assert cls.__module__ == "conveyor.errors", f"{where} must live in conveyor.errors"
        assert cls.__name__ in errors.__all__, f"{where} is not in conveyor.errors.__all__"
        assert re.search(rf"(── |^ +){cls.__name__}\b", tree, re.M), f"{where}: not in the tree"


@pytest.mark.parametrize(
    ("name", "torch_type"),
    [
        ("CollateKeyError", KeyError),
        ("CollateShapeError", RuntimeError),
        ("CollateTypeError", TypeError),
        ("CollateTypeRuntimeError", RuntimeError),
        ("CollateTypeValueError", ValueError),
    ],
)
def test_collate_errors_keep_the_type_torch_raises(name: str, torch_type: type) -> None:
    from conveyor import errors

    cls = getattr(errors, name)
    assert issubclass(cls, errors.CollateError)
    assert issubclass(cls, torch_type)


def test_public_classes_name_a_public_module_that_holds_them() -> None:
    """A pickle (and a repr) names a class by its ``__module__``: the place users import it
    from, never a private module that a reorganisation may move (issue 41)."""
    import importlib

    wrong = []
    for name in conveyor.__all__:
        obj = getattr(conveyor, name)
        if not isinstance(obj, type):
            continue
        module = obj.__module__
        private = any(part.startswith("_") for part in module.split("."))
        held = getattr(importlib.import_module(module), obj.__qualname__, None) is obj
        if private or not held:
            wrong.append(f"{name}: {module}.{obj.__qualname__}")
    assert not wrong, "classes a user may pickle, named by a private or wrong module:\n" + (
        "\n".join(wrong)
    )
