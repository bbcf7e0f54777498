"""A training script with ``progress=True`` and ``report=True``, whose stderr's reader is
gone (the test closes it): it must train to the end and exit with status 0.

Usage: ``python progress_to_nowhere.py tqdm|plain`` (``plain``: as if tqdm were not
installed). Prints ``trained N batches`` on stdout at the end.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from conveyor import DataLoader

if sys.argv[1] == "plain":
    find_spec = importlib.util.find_spec

    def without_tqdm(name: str, *args: Any) -> Any:
        return None if name == "tqdm" else find_spec(name, *args)

    importlib.util.find_spec = without_tqdm

loader = DataLoader(list(range(40)), batch_size=4, num_workers=2, progress=True, report=True)
batches = sum(1 for _epoch in range(2) for _batch in loader)
print(f"trained {batches} batches", flush=True)
