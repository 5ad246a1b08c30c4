"""The single-process reference run, the noise-floor record and the verdicts the report draws from them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from analysis.learning_refs import learning_refs
from ground.config import load_config, to_dict
from analysis.noise_floor_record import learning_config_hash, match
from xdc.noise_floor import summarise
from xdc.reference import eval_points_tokens, run_reference

TINY = {"model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": 32},
        "train": {"per_site_batch": 4, "inner_steps_h": 2, "target_useful_tokens": 3_200, "eval_every_rounds": 2,
                  "lr_warmup_tokens": 512, "inner_lr": 1e-2, "device": "cpu"}}


@dataclass
class _H:
    config: dict


def _cfg_dict(**train) -> dict:
    return to_dict(load_config({**TINY, "train": {**TINY["train"], **train}}))


def test_config_hash_ignores_seed_threads_and_cadence_but_not_the_recipe():
    base = learning_config_hash(_cfg_dict())
    assert learning_config_hash(_cfg_dict(seed=7, threads_per_site=2, eval_every_rounds=5)) == base
    assert learning_config_hash(_cfg_dict(inner_lr=3e-3)) != base
    assert learning_config_hash(_cfg_dict(lr_warmup_tokens=1024)) != base


def test_a_record_is_used_only_for_its_own_dataset_and_config():
    cfg = _cfg_dict()
    rec = {"dataset_id": "d1", "config_hash": learning_config_hash(cfg), "n_seeds": 5, "runs": [],
           **summarise([2.00, 2.02, 2.01, 2.03, 1.99])}
    assert match(rec, "d1", cfg)["evidence"] == "measured"
    other = match(rec, "d1", _cfg_dict(inner_lr=3e-3))
    assert other["evidence"] == "unavailable" and "not measured for this config" in other["reason"]
    assert "dataset id" in match(rec, "d2", cfg)["reason"]
    assert match(None, "d1", cfg)["evidence"] == "unavailable"


def test_a_config_without_its_data_section_matches_no_record_and_says_why():
    """A hand-made or truncated config.json (no `data`) made `xdc analyze` die with a KeyError."""
    cfg = _cfg_dict()
    rec = {"dataset_id": "d1", "config_hash": learning_config_hash(cfg), "n_seeds": 5, "runs": [],
           **summarise([2.00, 2.02, 2.01, 2.03, 1.99])}
    partial = {k: v for k, v in cfg.items() if k != "data"}
    got = match(rec, "d1", partial)
    assert got["evidence"] == "unavailable" and "no 'data'" in got["reason"], got
    no_sites = {**cfg, "cluster": {}}
    assert "'cluster.sites'" in match(rec, "d1", no_sites)["reason"]


def test_differences_inside_the_floor_are_no_measurable_difference(tmp_path: Path):
    cfg = _cfg_dict()
    finals = [2.00, 2.02, 2.01, 2.03, 1.99]
    s = summarise(finals)
    assert s["spread_nll"] == pytest.approx(0.04) and s["threshold_nats"] >= s["spread_nll"]
    rec = tmp_path / "nf.json"
    rec.write_text(json.dumps({"dataset_id": "d1", "config_hash": learning_config_hash(cfg), "n_seeds": 5,
                               "runs": [], **s}))
    sections = [{"policy": p, "learning": {"final_heldout_nll": v}, "provenance": {"dataset_id": "d1"}}
                for p, v in (("stall", 2.00), ("elastic", 2.01), ("restart", 2.50))]
    out = learning_refs([_H(cfg)] * 3, sections, None, record_path=rec)
    verdicts = {(d["a"], d["b"]): d["verdict"] for d in out["differences"]}
    assert verdicts[("stall", "elastic")] == "no measurable difference"
    assert verdicts[("stall", "restart")] == "measurable"
    # Another recipe: the same record is not reused.
    out2 = learning_refs([_H(_cfg_dict(inner_lr=3e-3))] * 3, sections, None, record_path=rec)
    assert out2["noise_floor"]["evidence"] == "unavailable"
    assert {d["verdict"] for d in out2["differences"]} == {"noise floor not measured for this config"}


def test_the_reference_evaluates_where_the_cluster_does_and_learns(tmp_path: Path):
    torch.set_num_threads(1)
    cfg = load_config(TINY)
    # 3 sites x 4 x 2 = 24 samples (768 tokens) a round; eval every 2 rounds and at the cut end (100 samples).
    assert eval_points_tokens(cfg, 3) == [0, 1536, 3072, 3200]
    curve = run_reference(cfg, tmp_path)
    events = [json.loads(l) for l in (tmp_path / "logs" / "reference.jsonl").read_text().splitlines()]
    evals = [e for e in events if e["event"] == "eval"]
    assert [e["useful_tokens_trained"] for e in evals] == [0, 1536, 3072, 3200] == [t for t, _ in curve]
    assert all(isinstance(e["heldout_nll"], float) for e in evals)
    assert evals[-1]["heldout_nll"] < evals[0]["heldout_nll"] - 0.5
    # learning_refs reads it back from a comparison index and states each policy's gap.
    sections = [{"policy": "stall", "learning": {"final_heldout_nll": 4.0}, "provenance": {"dataset_id": "x"}}]
    out = learning_refs([_H(to_dict(cfg))], sections, {"reference": {"dir": str(tmp_path)}},
                        record_path=tmp_path / "none.json")
    ref = out["reference"]
    assert ref["evidence"] == "measured" and ref["final_heldout_nll"] == evals[-1]["heldout_nll"]
    assert ref["gap_by_policy"]["stall"] == pytest.approx(4.0 - evals[-1]["heldout_nll"])


def test_the_reference_takes_every_core_only_on_an_idle_machine():
    from xdc.compare import reference_threads

    assert reference_threads(2, 0.3) == 2 and reference_threads(16, 7.9) == 16
    assert reference_threads(2, 1.0) == 1 and reference_threads(2, 20.0) == 1


def test_a_record_from_another_evaluation_set_is_not_used():
    cfg = _cfg_dict()
    rec = {"dataset_id": "d1", "config_hash": learning_config_hash(cfg), "n_seeds": 5, "runs": [], "eval_set": None,
           **summarise([2.0, 2.1, 2.0, 2.1, 2.0])}
    assert match(rec, "d1", cfg, None)["evidence"] == "measured"
    out = match(rec, "d1", cfg, {"windows": 512, "sha256": "ab"})
    assert out["evidence"] == "unavailable" and "evaluation set" in out["reason"]


def test_a_study_arm_finds_its_own_record_among_several(tmp_path: Path):
    """The demo's record and a study arm's record side by side: each config gets the record measured
    for it (and the file it came from); a config with none gets the first record's reason; an
    unreadable record is a reason, not a crash."""
    from analysis.learning_refs import match_records, noise_floor_records

    demo, study = _cfg_dict(), _cfg_dict(inner_lr=3e-3)
    for name, cfg, finals in (("noise_floor.json", demo, [2.0, 2.02]), ("noise_floor_s-v2.json", study, [2.5, 2.6])):
        (tmp_path / name).write_text(json.dumps({"dataset_id": "d1", "config_hash": learning_config_hash(cfg),
                                                 "n_seeds": 2, "runs": [], **summarise(finals)}))
    (tmp_path / "noise_floor_broken-v1.json").write_text("{not json")
    paths = noise_floor_records(tmp_path)
    assert [p.name for p in paths] == ["noise_floor.json", "noise_floor_broken-v1.json", "noise_floor_s-v2.json"]
    got = match_records(paths, "d1", study)
    assert (got["evidence"], got["record_file"], round(got["mean_nll"], 3)) == ("measured", "noise_floor_s-v2.json", 2.55)
    assert match_records(paths, "d1", demo)["record_file"] == "noise_floor.json"
    none = match_records(paths, "d1", _cfg_dict(lr_warmup_tokens=1024))
    assert none["evidence"] == "unavailable" and "not measured for this config" in none["reason"]
    assert match_records([], "d1", demo)["reason"].startswith("no noise-floor record")
    only_broken = match_records([tmp_path / "noise_floor_broken-v1.json"], "d1", demo)
    assert only_broken["evidence"] == "unavailable" and "cannot be read" in only_broken["reason"]


def test_the_floor_of_a_study_arm_is_measured_on_that_arms_config_without_faults():
    """`xdc noise-floor --study`: the arm's run config in the first evaluation stratum (its data order,
    its recipe), no faults; a study whose control is chosen by rule needs --arm; unknown names are errors."""
    from xdc.noise_floor import study_config

    data, src = study_config("studies/protocols/controller-heldout.yaml", "fixed-h32", None)
    assert (src["study"], src["arm"], src["stratum"], src["policy"]) == ("controller-heldout", "fixed-h32",
                                                                        "bw-collapse-mild", "elastic")
    cfg = load_config(data)
    assert (cfg.data.shuffle_seed, cfg.train.inner_steps_h, cfg.train.per_site_batch, cfg.model.n_layers) == \
        (1022, 32, 2, 2)
    assert cfg.train.target_useful_tokens == 524_288
    with pytest.raises(SystemExit, match="chooses its control from the runs"):
        study_config("studies/protocols/controller-heldout.yaml", None, None)
    with pytest.raises(SystemExit, match="no arm 'nope'"):
        study_config("studies/protocols/controller-heldout.yaml", "nope", None)
    with pytest.raises(SystemExit, match="no stratum 'nope'"):
        study_config("studies/protocols/controller-heldout.yaml", "fixed-h8", "nope")
    data, src = study_config("studies/protocols/equal-work.yaml", None, "s2-preempt")
    assert src["arm"] == "fixed-local" and load_config(data).data.shuffle_seed == 2234
