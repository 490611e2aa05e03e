"""Puts ``tests/`` on ``sys.path`` so that a bench script run as ``python bench/x.py`` imports
the helpers it shares with the tests (``from support.graphs import graph_config``).

The one place bench reaches into ``tests/``: a script that needs ``support`` imports this module
before it (``import support_path  # noqa: F401``). Only ``tests/support`` is meant to be
imported from there, never a test module.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
