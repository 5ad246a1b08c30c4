"""`xdc analyze` refuses what is not a run, with a precise message. The analysis of a real four-policy
comparison and its checkers on deliberately broken logs: tests/live/test_analysis.py."""

from __future__ import annotations

import json

import pytest

from analysis.analyze import analyze
from analysis.load import AnalysisInputError, load_run
from xdc.cli import main as xdc_main


def test_analyze_refuses_what_is_not_a_run_with_a_precise_message(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(AnalysisInputError, match="neither a run directory"):
        analyze([tmp_path / "empty"])
    assert xdc_main(["analyze", str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err
    bad = tmp_path / "bad"
    (bad / "logs").mkdir(parents=True)
    (bad / "config.json").write_text("{not json")
    (bad / "logs" / "a.jsonl").write_text("{}\n")
    with pytest.raises(AnalysisInputError, match=r"config.json:1:2: not valid JSON"):
        load_run(bad)
    # A config.json without the sections the analysis reads: refused by name, not a KeyError later.
    for cfg, what in (({"cluster": {"sites": ["a"]}, "train": {}}, "has no model"),
                      ({"model": {}, "train": {}}, "has no cluster.sites"),
                      ({"model": {}, "train": {}, "cluster": {"sites": []}}, "has no cluster.sites"),
                      ({"model": {}, "cluster": {"sites": ["a"]}}, "has no train"),
                      ({"model": {"seq_len": 128}, "train": {"target_useful_tokens": "many"},
                        "cluster": {"sites": ["a"]}}, r"train.target_useful_tokens = 'many', not an integer >= 0"),
                      ({"model": {"seq_len": 0}, "train": {}, "cluster": {"sites": ["a"]}}, r"model.seq_len = 0"),
                      ([], "is a JSON list, not an object")):
        (bad / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(AnalysisInputError, match=what):
            load_run(bad)
    assert xdc_main(["analyze", str(bad)]) == 2
    (bad / "config.json").write_text(json.dumps({"model": {}, "train": {}, "cluster": {"sites": ["a"]}}))
    for name, doc, what in (("topology.json", [], "topology is a JSON list"),
                            ("scenario.json", [], "scenario is a JSON list"),
                            ("scenario.json", {"name": "x", "faults": "nope"}, "'faults' must be a list of objects"),
                            ("scenario.json", {"name": "x", "faults": [1]}, "a list holding a non-object")):
        (bad / name).write_text(json.dumps(doc))
        with pytest.raises(AnalysisInputError, match=what):
            load_run(bad)
        (bad / name).unlink()
    assert "is a JSON list, not an object" in capsys.readouterr().err  # a clear error, exit 2, no traceback
