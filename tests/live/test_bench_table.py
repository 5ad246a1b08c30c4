"""The performance table is generated from the result files, and says when a result is stale."""

from __future__ import annotations

import subprocess

import pytest

from bench.common import write_result
from bench.run_all import ROOT, staleness


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def test_a_result_measured_at_head_is_current() -> None:
    head = _git("rev-parse", "HEAD")
    assert staleness({"env": {"git_commit": head}, "measures": ["bench/"]}) is None


def test_a_result_older_than_the_code_it_measures_is_stale() -> None:
    # The first commit of the repository is older than every later change to README.md.
    first = _git("rev-list", "--max-parents=0", "HEAD").splitlines()[0]
    why = staleness({"env": {"git_commit": first}, "measures": ["README.md"]})
    assert why is not None and "later commit(s) touch README.md" in why


def test_a_result_that_does_not_say_what_it_measures_is_stale() -> None:
    head = _git("rev-parse", "HEAD")
    assert "not recorded" in (staleness({"env": {"git_commit": head}}) or "")
    assert staleness({"env": {}, "measures": ["bench/"]}) == "no commit recorded"


def test_a_result_must_say_what_its_reference_is(tmp_path) -> None:
    with pytest.raises(ValueError, match="reference 'vibes'"):
        write_result("x", ratio=1.0, goal="<= 1", passed=True, raw={}, env={}, notes="", reference="vibes",
                     measures=["bench/"])


def test_a_result_measured_with_uncommitted_changes_to_its_code_is_stale() -> None:
    head = _git("rev-parse", "HEAD")
    why = staleness({"env": {"git_commit": head, "git_dirty": True, "dirty_measured": ["wan/node.py"]},
                     "measures": ["wan/"]})
    assert why == "measured with uncommitted changes to wan/node.py"
    # A dirty tree elsewhere does not stale it: only the code it measures counts.
    assert staleness({"env": {"git_commit": head, "git_dirty": True, "dirty_measured": []}, "measures": ["bench/"]}) \
        is None


def test_a_result_records_the_tree_it_was_measured_from(tmp_path, monkeypatch) -> None:
    import bench.common as common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    out = write_result("x", ratio=1.0, goal="<= 1", passed=True, raw={}, env={"git_commit": _git("rev-parse", "HEAD")},
                       notes="", reference="fixed_goal", measures=["bench/"])
    assert isinstance(out["env"]["git_dirty"], bool) and isinstance(out["env"]["dirty_measured"], list)
    assert (tmp_path / "x.json").is_file()
