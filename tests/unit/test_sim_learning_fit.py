"""The simulator's learning curve (sim/learning_fit.py): fitted to emulator evaluations where they
exist (`modeled`, with uncertainty), the prior (`prior`) where they don't, and used by a simulation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ground.config import load_config, merge, save_config
from sim.calibrate import calibrate
from sim.learning_fit import PRIOR, LearningCurve, fit_learning
from sim.model import SimModel
from sim.world import simulate
from tests.conftest import COMPARE_CFG

TRUE = LearningCurve(start_nll=5.3, floor_nll=1.6, scale_tokens=6e3, alpha=0.35, h_penalty_per_doubling=0.02)


def _run(root: Path, name: str, h: int, tokens: list[int], seed: int) -> Path:
    """A run directory as the emulator writes it, holding only what the fit reads: config.json and
    each site's `eval` events (noise of the stated standard error around a known curve)."""
    run = root / name
    (run / "logs").mkdir(parents=True)
    save_config(load_config({"train": {"inner_steps_h": h, "mode": "local"}}), run / "config.json")
    rng = np.random.default_rng(seed)
    lines = [json.dumps({"id": f"a:{i}", "event": "eval", "process": "a", "start_mono_ns": i * 10**9,
                         "end_mono_ns": i * 10**9 + 5 * 10**8, "useful_tokens_trained": t,
                         "heldout_nll": TRUE.nll(t, h) + rng.normal(0, 0.01), "heldout_nll_se": 0.01})
             for i, t in enumerate(tokens)]
    (run / "logs" / "a.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_the_fit_recovers_a_known_curve_with_its_uncertainty(tmp_path: Path) -> None:
    grid = [0, 4096, 16384, 49152, 98304, 196608, 393216, 786432, 1179648]
    fit = fit_learning([_run(tmp_path, "r1", 8, grid, 1), _run(tmp_path, "r2", 8, grid[1:], 2)])
    assert fit.evidence == "modeled" and fit.n_points == 17 and fit.source_runs == ("r1", "r2")
    assert "H penalty is the prior's" in fit.source  # one H value cannot fit it
    for t in (10_000, 300_000, 1_000_000):  # the curve, within noise, where there were data
        assert fit.nll(t, 8) == pytest.approx(TRUE.nll(t, 8), abs=0.03)
    assert fit.rmse_nats is not None and fit.rmse_nats < 0.03
    assert set(fit.uncertainty) == {"start_nll", "floor_nll", "scale_tokens", "alpha"}
    assert fit.start_nll == pytest.approx(TRUE.start_nll, abs=3 * fit.uncertainty["start_nll"] + 0.01)


def test_too_few_evaluations_leave_the_prior(tmp_path: Path) -> None:
    fit = fit_learning([_run(tmp_path, "r1", 8, [0, 4096, 16384], 1)])
    assert fit == PRIOR and fit.evidence == "prior" and "not fitted" in fit.source


def test_a_calibrated_simulation_logs_the_fitted_curve_as_modeled(tmp_path: Path) -> None:
    grid = [0, 4096, 16384, 49152, 98304, 196608, 393216]
    doc = calibrate([_run(tmp_path, "r1", 4, grid, 3)])
    assert doc["learning"]["evidence"] == "modeled"
    model = SimModel.from_calibration(doc)
    curve = LearningCurve.from_json(model.learning)
    cfg = load_config(merge(COMPARE_CFG, {"runs_dir": str(tmp_path)}))
    out = tmp_path / "sim"
    assert simulate(cfg, None, model, out).complete
    manifest = json.loads((out / "sim.json").read_text())
    assert manifest["learning"]["evidence"] == "modeled" and manifest["learning"]["n_points"] == len(grid)
    evals = [json.loads(l) for l in (out / "logs" / "a.jsonl").read_text().splitlines()
             if '"event": "eval"' in l]
    assert evals and all(e["evidence"] == "modeled" for e in evals)
    h = cfg.train.inner_steps_h
    assert all(e["heldout_nll"] == pytest.approx(curve.nll(e["useful_tokens_trained"], h)) for e in evals)
    # The analysis labels the run's final held-out NLL with the curve's class and source.
    from analysis.artifact import build_artifact

    nll = build_artifact([out])["runs"][0]["metrics"]["final_heldout_nll"]
    assert nll["evidence"] == "modeled" and "fitted" in nll["source"] and nll["source_runs"] == ["r1"]


def test_a_simulation_on_the_prior_curve_reports_its_final_nll_as_prior(tmp_path: Path) -> None:
    """Not fitted: the held-out NLL is the prior's guess, labelled `prior` with the curve's source,
    never `measured` (nor `modeled`, which would claim a fit)."""
    from analysis.artifact import build_artifact

    cfg = load_config(merge(COMPARE_CFG, {"runs_dir": str(tmp_path)}))
    assert simulate(cfg, None, SimModel(), tmp_path / "sim").complete
    run = build_artifact([tmp_path / "sim"])["runs"][0]
    nll = run["metrics"]["final_heldout_nll"]
    assert nll["value"] is not None and nll["evidence"] == "prior" and "not fitted" in nll["source"]
    assert run["learning"]["evidence"] == "prior"
