"""The resume tests share the fault tests' leak check and start-method fixture."""

from tests.faults.conftest import (  # noqa: F401  (pytest finds fixtures and hooks by name)
    leak_check,
    pytest_runtest_makereport,
    start_method,
)
