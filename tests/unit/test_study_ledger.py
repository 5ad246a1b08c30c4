"""The study ledger: what a resumed study skips, what it runs again, a torn last line."""

from __future__ import annotations

from studies.ledger import Ledger


def test_finished_runs_are_kept_and_an_interrupted_one_is_named(tmp_path):
    led = Ledger(tmp_path / "ledger.jsonl")
    led.append({"type": "study_started", "sha256": "a" * 64, "version": 1})
    led.append({"type": "run_started", "key": "s0/x", "run_dir": "r1"})
    led.append({"type": "run_finished", "key": "s0/x", "run_dir": "r1"})
    led.append({"type": "run_started", "key": "s0/y", "run_dir": "r2"})  # killed here
    with (tmp_path / "ledger.jsonl").open("a") as f:
        f.write('{"type": "run_fini')  # the torn line of a killed study
    again = Ledger(tmp_path / "ledger.jsonl")
    assert list(again.finished()) == ["s0/x"]
    assert again.interrupted() == {"s0/y": ["r2"]}
    assert again.protocols() == [("a" * 64, 1)]
    again.append({"type": "run_finished", "key": "s0/y", "run_dir": "r3"})  # readable after the torn line
    assert sorted(again.finished()) == ["s0/x", "s0/y"] and again.interrupted() == {}
