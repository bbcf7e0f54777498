"""The warning for accelerate replacing a conveyor loader with torch's: when it comes, and
when it does not. accelerate's read of ``_is_accelerate_prepared`` is played here by code
compiled as one of accelerate's modules; the real accelerate, in one and two processes,
is in ``tests/frameworks/test_accelerate.py``."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor import DataLoader, LoaderReplacedWarning
from conveyor.integrations.replaced import prepared_by_conveyor


def _accelerate_asks(loader: DataLoader) -> Any:
    """What ``Accelerator.prepare_data_loader`` does first, from a module of accelerate's."""
    namespace: dict[str, Any] = {"__name__": "accelerate.accelerator", "loader": loader}
    exec('prepared = getattr(loader, "_is_accelerate_prepared", False)', namespace)
    return namespace["prepared"]


def test_accelerate_preparing_a_conveyor_loader_is_told_once_with_the_fix() -> None:
    loader = DataLoader(list(range(8)), batch_size=2, on_error="skip")

    with pytest.warns(LoaderReplacedWarning) as caught:
        assert _accelerate_asks(loader) is False
    assert _accelerate_asks(loader) is False  # once per loader (warnings are errors here)

    message = str(caught[0].message)
    assert "conveyor's options (on_error='skip')" in message
    assert "`from conveyor.integrations.accelerate import Accelerator`" in message
    loader._is_accelerate_prepared = True  # accelerate marks what it prepared
    assert _accelerate_asks(loader) is True


def test_no_warning_when_conveyor_prepares_it_or_other_code_looks() -> None:
    loader = DataLoader(list(range(8)), batch_size=2)
    with prepared_by_conveyor(loader), prepared_by_conveyor(loader):  # nested, as it happens
        assert _accelerate_asks(loader) is False
    assert loader._is_accelerate_prepared is False  # a debugger, a tool listing attributes
    assert hasattr(loader, "_is_accelerate_prepared")
    with pytest.warns(LoaderReplacedWarning):  # not prepared by conveyor any more
        _accelerate_asks(loader)
