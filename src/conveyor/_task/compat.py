"""Names newer Pythons have, for the oldest one conveyor supports (3.10)."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    from typing import assert_never
else:  # pragma: no cover - exercised on 3.10 only
    from typing import NoReturn

    def assert_never(value: NoReturn) -> NoReturn:
        raise AssertionError(f"unhandled case: {value!r}")


__all__ = ["assert_never"]
