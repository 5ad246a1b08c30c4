"""The sites of tests/unit/test_process_table.py and tests/live/test_process_table.py."""

from __future__ import annotations


SITES = ("a", "b", "c")
