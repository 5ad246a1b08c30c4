"""Factorial studies (studies/factorial.py, the protocol's `contrasts` and `start_state`, the study energy
metrics): pure logic against known values; no cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studies.factorial import block_values, contrast_table, contrast_value
from studies.protocol import ProtocolError, load_protocol, parse_protocol
from studies.stats import decide_gate

ROOT = Path(__file__).resolve().parents[2]
W = {"dense-replay": -1, "dense-continue": 1, "sparse-replay": 1, "sparse-continue": -1}


def test_interaction_contrast_against_known_values() -> None:
    x = {"dense-replay": 10.0, "dense-continue": 9.0, "sparse-replay": 14.0, "sparse-continue": 8.0}
    # (SR - DR) - (SC - DC) = (14 - 10) - (8 - 9) = 5
    assert contrast_value(W, x) == 5.0
    assert contrast_value(W, {**x, "sparse-replay": None}) is None
    assert contrast_value({"sparse-continue": 1, "dense-replay": -1}, x, relative=True) == pytest.approx(8 / 10 - 1)


def test_contrast_gate_is_the_exact_sign_flip_over_blocks() -> None:
    # 8 blocks, arm values chosen so the interaction is +1, +2, ..., +8 (all positive): p = 1/256
    by = {}
    for b in range(8):
        for a, v in {"dense-replay": 10.0, "dense-continue": 10.0, "sparse-replay": 11.0 + b,
                     "sparse-continue": 10.0}.items():
            by[(f"b{b}", a)] = {"metrics": {"energy_j": {"value": v}}}
    rows = block_values(W, "energy_j", [f"b{b}" for b in range(8)], by)
    assert [r["value"] for r in rows] == [1.0 + b for b in range(8)]
    g = decide_gate({"name": "i", "metric": "energy_j", "kind": "superiority", "direction": "higher", "margin": 0,
                     "alpha": 0.05}, [r["value"] for r in rows])
    assert g["status"] == "pass" and g["p"] == pytest.approx(1 / 256) and g["n_patterns"] == 256 and g["exact"]
    # one block flipped to -1 (the smallest): 2 of 256 patterns reach the observed sum or more
    d = [-1.0, *[1.0 + b for b in range(1, 8)]]
    g2 = decide_gate({"name": "i", "metric": "energy_j", "kind": "superiority", "direction": "higher", "margin": 0,
                      "alpha": 0.05}, d)
    assert g2["p"] == pytest.approx(2 / 256)


def test_one_block_has_two_sign_patterns() -> None:
    from studies.stats import sign_flip_p

    assert sign_flip_p([3.0]) == {"p": 0.5, "n_patterns": 2, "exact": True}
    assert sign_flip_p([-3.0])["p"] == 1.0 and sign_flip_p([0.0])["p"] == 1.0
    assert sign_flip_p([3.0, 1.0])["p"] == pytest.approx(0.25)  # scipy's, from two blocks on


def test_withheld_numbers_give_a_diagnostic_contrast_that_decides_nothing() -> None:
    class C:
        name, weights = "interaction", W

    by = {("b1", a): {"metrics": {"energy_j": {"value": None, "diagnostic_value": v}}}
          for a, v in {"dense-replay": 1.0, "dense-continue": 2.0, "sparse-replay": 4.0, "sparse-continue": 3.0}.items()}
    (row,) = contrast_table([C], ["energy_j"], ["b1"], by)
    assert row["blocks"][0]["value"] is None and row["n_with_value"] == 0
    assert row["diagnostic"]["blocks"][0]["value"] == -1 + 2 + 4 - 3 and "decide no gate" in row["diagnostic"]["label"]
    g = decide_gate({"name": "i", "metric": "energy_j", "kind": "superiority", "direction": "higher", "margin": 0,
                     "alpha": 0.5}, [r["value"] for r in row["blocks"]])
    assert g["status"] == "unknown"


BASE = """
name: x
question: q?
claim: c.
target_useful_tokens: 1024
arms: [{name: dr, policy: restart}, {name: dc}, {name: sr, policy: restart}, {name: sc}]
contrast: {treatment: sc, control: dr}
strata: [{name: b1}]
gates:
  - {name: g, metric: energy_j, kind: superiority, direction: higher, alpha: 0.5, contrast: inter}
"""


def test_protocol_contrasts_are_validated_with_file_line_and_field() -> None:
    ok = parse_protocol(BASE + "contrasts: [{name: inter, weights: {dr: -1, dc: 1, sr: 1, sc: -1}}]\n", "p.yaml")
    assert ok.contrast("inter").weights == {"dr": -1, "dc": 1, "sr": 1, "sc": -1}
    assert ok.to_dict()["contrasts"][0]["name"] == "inter" and ok.to_dict()["gates"][0]["contrast"] == "inter"
    with pytest.raises(ProtocolError, match=r"p.yaml:\d+: contrasts\[0\].weights: the weights must sum to 0"):
        parse_protocol(BASE + "contrasts: [{name: inter, weights: {dr: -1, dc: 1, sr: 1}}]\n", "p.yaml")
    with pytest.raises(ProtocolError, match=r"contrasts\[0\].weights.sr: a weight is \+1 or -1"):
        parse_protocol(BASE + "contrasts: [{name: inter, weights: {dr: -1, dc: 1, sr: 2, sc: -2}}]\n", "p.yaml")
    with pytest.raises(ProtocolError, match=r"gates\[0\].contrast: 'inter' is not one of \['other'\]"):
        parse_protocol(BASE + "contrasts: [{name: other, weights: {dr: -1, sc: 1}}]\n", "p.yaml")
    rel = BASE.replace("contrast: inter}", "contrast: inter, relative: true}")
    with pytest.raises(ProtocolError, match="a relative gate needs a two-arm contrast"):
        parse_protocol(rel + "contrasts: [{name: inter, weights: {dr: -1, dc: 1, sr: 1, sc: -1}}]\n", "p.yaml")


def test_start_state_forms() -> None:
    c = "contrasts: [{name: inter, weights: {dr: -1, dc: 1, sr: 1, sc: -1}}]\n"
    run = parse_protocol(BASE + c + "start_state: {target_useful_tokens: 512}\n", "p.yaml")
    assert run.start_state == {"target_useful_tokens": 512, "config": {}}
    ck = parse_protocol(BASE + c + f"start_state: {{store_dir: /x/store, manifest_sha256: {'a' * 64}}}\n", "p.yaml")
    assert ck.to_dict()["start_state"]["manifest_sha256"] == "a" * 64
    with pytest.raises(ProtocolError, match=r"start_state.manifest_sha256: expected a SHA-256"):
        parse_protocol(BASE + c + "start_state: {store_dir: /x, manifest_sha256: abc}\n", "p.yaml")
    with pytest.raises(ProtocolError, match="not both"):
        parse_protocol(BASE + c + f"start_state: {{store_dir: /x, manifest_sha256: {'a' * 64}, "
                                  "target_useful_tokens: 5}\n", "p.yaml")


def test_a_paired_protocol_hashes_as_before() -> None:
    """The new keys appear in the canonical form only when used: registered paired studies keep their hash."""
    from studies.registry import protocol_hash

    reg = json.loads((ROOT / "studies" / "registry.json").read_text())
    for name in ("tiny", "equal-work"):
        p = load_protocol(ROOT / "studies" / "protocols" / f"{name}.yaml")
        assert "contrasts" not in p.to_dict() and "start_state" not in p.to_dict()
        assert protocol_hash(p) == reg["studies"][name][-1]["sha256"], name


def test_the_shipped_2x2_protocols_load_and_resolve() -> None:
    from studies.protocol import arm_configs

    for name, blocks in (("cadence-continuation", 8), ("cadence-continuation-tiny", 1)):
        p = load_protocol(ROOT / "studies" / "protocols" / f"{name}.yaml")
        cfgs = arm_configs(p)
        assert [a.name for a in p.arms] == ["dense-replay", "dense-continue", "sparse-replay", "sparse-continue"]
        assert len(p.strata) == blocks and all(s.faults for s in p.strata) and len(p.gates) == 11
        assert {c.checkpoint_every_rounds for c in (cfgs["dense-replay"].train, cfgs["dense-continue"].train)} != \
            {c.checkpoint_every_rounds for c in (cfgs["sparse-replay"].train, cfgs["sparse-continue"].train)}
        assert cfgs["dense-replay"].recovery.policy == "restart" and cfgs["sparse-continue"].recovery.policy == "elastic"
        assert p.start_state and p.start_state["target_useful_tokens"] > 0


# ---------------------------------------------------------------------------------- energy metrics
def _section(measured: float | None, withdrawn: list[str], phases: dict[str, float | None]) -> dict:
    claims = [{"claim": "run_energy", "status": "withdrawn" if withdrawn else "stands",
               "reason": f"withdrawn by {', '.join(withdrawn)}" if withdrawn else "no invalidator fired"}]
    claims += [{"claim": f"phase_energy:{p}", "status": "stands", "reason": "no invalidator fired"} for p in phases]
    return {"evidence": "measured", "reason": None, "sampler": {"ran": True}, "claims": claims,
            "run_energy": {"measured": {"value": measured, "unit": "J", "evidence": "measured"},
                           "modeled": {"value": 5.0}, "idle_subtracted": {"value": None}},
            "phases": [{"phase": p, "energy": {"value": v, "evidence": "measured"}} for p, v in phases.items()]}


def test_study_energy_metrics_follow_the_claims() -> None:
    from studies.energy import group_energy, run_energy

    ok = _section(100.0, [], {"checkpoint": 7.0, "replay": 11.0, "recovery": 2.0, "compute": 60.0})
    assert run_energy(ok) == {"value": 100.0, "unit": "J", "evidence": "measured", "claim": "stands"}
    assert group_energy(ok, ("checkpoint",))["value"] == 7.0
    assert group_energy(ok, ("replay", "recovery", "state_transfer"))["value"] == 13.0  # state_transfer never entered
    bad = _section(100.0, ["logger_calibration"], {"checkpoint": 7.0})
    r = run_energy(bad)
    assert r["value"] is None and r["diagnostic_value"] == 100.0 and "logger_calibration" in r["reason"]
    none = {"evidence": "modeled", "reason": "no energy meter readable: nvml0.energy: no_library",
            "sampler": {"ran": True}, "claims": [{"claim": "run_energy", "status": "unavailable",
                                                   "reason": "no energy meter readable"}],
            "run_energy": {"measured": {"value": None, "unit": "J", "evidence": "unavailable",
                                        "reason": "no energy meter readable: nvml0.energy: no_library"}},
            "phases": [{"phase": "checkpoint", "energy": {"value": None, "evidence": "unavailable"}}]}
    for q in (run_energy(none), group_energy(none, ("checkpoint",))):
        assert q["evidence"] == "unavailable" and "nvml0.energy" in q["reason"] and "diagnostic_value" not in q


# ------------------------------------------------------------------------------------- start state
def _store_with_state(root: Path, trainer) -> tuple[str, dict]:
    """A durable checkpoint of `trainer`'s state, written as the store service writes one."""
    import safetensors.torch

    from checkpoint_store.blobstore import BlobStore

    store = BlobStore(root)
    blobs = {}
    for name, tensors in trainer.state_tensors().items():
        blobs[name] = store.put_blob(safetensors.torch.save({k: v.contiguous() for k, v in tensors.items()}))
    h = store.put_manifest({"run_id": "earlier", "ckpt_id": "e1r2", "round": 2, "step": 12, "epoch": 1,
                            "parent": None, "samples": 96, "blobs": blobs, "created_wall_ns": 1,
                            "params_hash": trainer.params_hash()})
    return h, blobs


def test_a_run_starts_from_a_verified_durable_checkpoint(tmp_path: Path) -> None:
    import torch

    from ground.config import load_config
    from site_agent.init_state import InitStateError, start_trainer
    from site_agent.trainer import SiteTrainer

    small = {"model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": 16},
             "train": {"per_site_batch": 2, "device": "cpu", "seed": 7, "mode": "local"}}
    trained = SiteTrainer(load_config(small), torch.device("cpu"))
    x = torch.randint(0, 256, (2, 16))
    for _ in range(3):  # a state the seed does not give: trained weights and AdamW moments
        trained.inner_step(x, x, frontier_tokens=0)
    trained.apply_outer(trained.pseudo_gradient(), frontier_tokens=0)
    h, blobs = _store_with_state(tmp_path / "store", trained)
    fresh = SiteTrainer(load_config(small), torch.device("cpu"))
    assert fresh.init_state is None and fresh.params_hash() != trained.params_hash()
    # the trainer itself reads nothing from disk: the start state is start_trainer's
    assert SiteTrainer(load_config({**small, "train": {**small["train"], "init_store_dir": str(tmp_path / "store"),
                                                       "init_manifest_sha256": h}}), torch.device("cpu")).init_state is None
    cfg = load_config({**small, "train": {**small["train"], "seed": 0, "init_store_dir": str(tmp_path / "store"),
                                          "init_manifest_sha256": h}})
    started = start_trainer(cfg, torch.device("cpu"))
    assert started.params_hash() == trained.params_hash()  # not the seed's weights: the checkpoint's
    assert started.init_state["manifest_sha256"] == h and started.init_state["from_round"] == 2
    assert started.inner_opt.state  # the optimizer state came with it
    # a damaged blob, a wrong hash, half a config: refused, naming why
    (tmp_path / "store" / "blobs" / blobs["model"]).write_bytes(b"not the blob")
    with pytest.raises(InitStateError, match="hashes to .* expected"):
        start_trainer(cfg, torch.device("cpu"))
    with pytest.raises(InitStateError, match="manifest"):
        start_trainer(load_config({**small, "train": {**small["train"], "init_store_dir": str(tmp_path / "store"),
                                                     "init_manifest_sha256": "0" * 64}}), torch.device("cpu"))
    with pytest.raises(InitStateError, match="both or neither"):
        start_trainer(load_config({**small, "train": {**small["train"], "init_manifest_sha256": h}}),
                    torch.device("cpu"))
