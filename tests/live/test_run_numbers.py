"""summary.json is a subset of the artifact: on a real run (the session's `local_run`), every number
the launcher's summary shares with `xdc analyze`'s artifact is equal, because both come from
analysis/run_numbers.py."""

from __future__ import annotations

import json

from analysis.artifact import build_artifact
from analysis.summary import CURVE_KEYS, WORK_TOTALS


def _plain(x):
    return json.loads(json.dumps(x))  # what summary.json holds: JSON, string keys


def test_every_number_the_summary_shares_with_the_artifact_is_equal(local_run) -> None:
    run_dir, _returned = local_run
    summary = json.loads((run_dir / "summary.json").read_text())
    run = _plain(build_artifact([run_dir])["runs"][0])
    metrics, work, learning = run["metrics"], run["work"], run["learning"]
    assert summary["useful_tokens"] == metrics["useful_tokens"]["value"] > 0
    for k in WORK_TOTALS:
        assert summary[k] == metrics[k]["value"] == work["total"][k], k
    assert summary["work_by_site"] == work["per_site"]
    assert summary["work_balanced"] is work["balanced"] is True
    assert summary["commits"] == work["commits"] > 0
    assert [{k: v for k, v in u.items() if k != "fate"} for u in work["lost_units"]] == summary["lost_units"]
    assert summary["frontier_hash"] == run["frontier"]["hash"] is not None
    assert summary["frontier_manifest_hash"] == run["frontier"]["manifest_hash"]
    assert summary["frontier_round"] == run["frontier"]["round"]
    assert summary["checkpoint_tree"] == run["checkpoint_tree"]
    assert summary["site_time"] == run["site_time"]["per_site"]
    assert summary["bytes_by_class"] == run["bytes"]["by_class"]
    assert summary["bytes_by_link"] == run["bytes"]["by_link"]
    assert summary["bytes_by_link_class"] == run["bytes"]["by_link_class"]
    assert summary["reconciliation"] == run["reconciliation"] and summary["reconciliation"]["evidence"] == "measured"
    # One NLL curve: the summary's points are the artifact's, key for key.
    assert summary["heldout_nll_curve"] == [{k: p[k] for k in CURVE_KEYS} for p in learning["curve"]]
    assert len(summary["heldout_nll_curve"]) >= 1
    assert summary["final_heldout_nll"] == learning["final_heldout_nll"] == metrics["final_heldout_nll"]["value"]
    assert summary["final_heldout_nll_se"] == metrics["final_heldout_nll"]["se"]
    assert summary["eval_set"] == learning["eval_set"]["id"]
    assert summary["baselines"] == learning["baselines"]
    assert summary["n_params"] == run["provenance"]["n_params"]
    assert summary["dataset_id"] == run["provenance"]["dataset_id"]
