"""Energy on one real small run with the sampler: every measured energy number `unavailable` with the
meter's reason, the modeled numbers labelled, the trace's hash in the artifact. The analysis on
synthetic histories: tests/unit/test_energy.py."""

from __future__ import annotations

import hashlib
import json

import pytest

from telemetry.trace import TRACE_NAME, read_trace


# --------------------------------------------------------------------------------- one real small run
def _nvml_readable() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


@pytest.mark.integration
def test_a_real_run_reports_energy_unavailable_or_modeled_with_the_reason_and_the_trace_hash(local_run, tmp_path):
    """The session's small real run (conftest.local_run) had the sampler: check summary, artifact and report."""
    from analysis.artifact import build_artifact, validate_artifact
    from analysis.report import render_report

    run_dir, summary = local_run
    assert summary["exit_codes"].get("telemetry") == 0
    events = [json.loads(x) for x in (run_dir / "logs" / "telemetry.jsonl").read_text().splitlines()]
    names = [e["event"] for e in events]
    assert names.index("sampler_ready") < names.index("trace_closed")
    # Its idle baseline before ran before any other process of the run started.
    launcher = [json.loads(x) for x in (run_dir / "logs" / "launcher.jsonl").read_text().splitlines()]
    store_started = next(e for e in launcher if e["event"] == "process_started" and e["name"] == "store")
    ready = next(e for e in events if e["event"] == "sampler_ready")
    assert ready["wall_ns"] < store_started["wall_ns"]
    closed = next(e for e in events if e["event"] == "trace_closed")
    sha = hashlib.sha256((run_dir / "logs" / TRACE_NAME).read_bytes()).hexdigest()
    assert closed["sha256"] == sha
    art = build_artifact([run_dir])
    validate_artifact(art)
    e = art["runs"][0]["energy"]
    assert e["trace"]["sha256"] == sha and e["trace"]["hash_matches"] and not e["trace"]["truncated"]
    stages = {p["stage"] for p in read_trace(run_dir / "logs" / TRACE_NAME).points}
    assert stages == {"baseline_before", "run", "baseline_after"}
    meters = {m["sensor"]: m for m in e["meters"]}
    rapl_readable = meters["rapl.energy"]["support"] == "ok"
    if _nvml_readable() or rapl_readable:
        pytest.skip("a meter is readable here: this test checks the no-meter machine")
    # No meter on this machine: every measured number unavailable, with the sensors' own reasons.
    assert meters["nvml0.energy"]["support"].startswith("unavailable:") and "nvmlInit" in meters["nvml0.energy"]["reason"]
    assert meters["rapl.energy"]["support"].startswith("unavailable:")
    for where in (summary["energy"]["measured"], art["runs"][0]["metrics"]["energy"], e["run_energy"]["measured"],
                  *[p["energy"] for p in e["phases"]], *[p["energy_per_token"] for p in e["phases"]],
                  *e["idle_baseline"]["measured"].values()):
        assert where["evidence"] == "unavailable" and where["value"] is None, where
        assert "nvml0.energy" in where["reason"] and "rapl.energy" in where["reason"], where
    assert summary["energy"]["evidence"] == "unavailable" and summary["energy"]["trace_sha256"] == sha
    assert all(c["status"] == "unavailable" for c in e["claims"])
    assert e["gate"]["status"] == "unknown" and summary["energy"]["gate"] == "unknown"
    # Only modeled numbers, labelled: CPU seconds of the sites, coordinator and store x a declared W/core.
    mod = e["run_energy"]["modeled"]
    assert mod["evidence"] == "modeled" and mod["value"] > 0 and "prior" in mod["derived"]
    assert e["evidence"] == "modeled" and all(p["energy_modeled"]["evidence"] == "modeled" for p in e["phases"])
    assert set(e["per_site"]["processes"]) >= {"a", "b", "c", "coord", "store"}
    assert {p["phase"] for p in e["phases"]} >= {"compute", "collective", "checkpoint"}
    html = render_report(art)
    assert f"data-trace-sha256='{sha}'" in html and "data-energy-gate='unknown'" in html
