"""Sample tests and helpers for tests/unit/test_live_marking.py to classify: one pure, one that starts a
process two helpers down, one fixture that starts a process. They sit in their own module because
the classifier follows the names a test's module holds: kept in the test module itself, the samples
would make the tests that inspect them live."""

from __future__ import annotations

import subprocess
from contextlib import contextmanager
from typing import Iterator


def _starts_a_process() -> None:
    subprocess.run(["true"], check=True)


@contextmanager
def _a_wrapped_helper() -> Iterator[None]:
    _starts_a_process()
    yield


def _pure_helper(x: int) -> int:
    return x + 1


def a_pure_test() -> None:
    assert _pure_helper(1) == 2


def a_test_through_two_helpers() -> None:
    with _a_wrapped_helper():
        pass


def a_fixture_that_starts_a_process() -> None:
    _starts_a_process()
