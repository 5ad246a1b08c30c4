"""`make compose-smoke` against a real Docker engine, beside a native run of the same config and scenario.

Needs the engine, the compose plugin and the images of `make compose-setup` (which `make test`
runs first); without them this test fails, it does not skip. The native run trains at the same
time as the compose cluster (both spend most of their time waiting on the shaped WAN), and both
must end at the same matched-frontier hash; `xdc analyze` of the two runs together must find the
same frontier (its `same_frontier` checker passes).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SCENARIO = "scenarios/compose-smoke.yaml"
CONFIG = "compose/run.yaml"


def _engine_problem() -> str | None:
    for argv in (["docker", "info"], ["docker", "compose", "version"]):
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"`{' '.join(argv)}`: {e}"
        if r.returncode != 0:
            return f"`{' '.join(argv)}` failed: {r.stderr.strip()[-300:]}"
    if not (ROOT / "compose" / ".env").exists():
        return "compose/.env is missing"
    return None


@pytest.mark.integration
@pytest.mark.timeout(1800)
def test_compose_smoke_passes_and_matches_the_native_run(tmp_path: Path) -> None:
    problem = _engine_problem()
    assert problem is None, f"the compose smoke needs a Docker engine and its images (run `make compose-setup`): {problem}"
    run_id = f"pytest-smoke-{os.getpid()}-{time.strftime('%H%M%S')}"
    native_runs = tmp_path / "native"
    native = subprocess.Popen([str(BIN / "xdc"), "run", "--config", CONFIG, "--scenario", SCENARIO,
                               "--runs-dir", str(native_runs), "--quiet"], cwd=ROOT,
                              stdout=open(tmp_path / "native.log", "w"), stderr=subprocess.STDOUT)
    try:
        # `-o setup`: the venv running this test is set up already; compose-setup (a no-op once done)
        # still makes sure of the engine, the plugin and the images.
        smoke = subprocess.run(["make", "--no-print-directory", "-o", "setup", "compose-smoke", f"SMOKE_RUN={run_id}",
                                f"SMOKE_SCENARIO={SCENARIO}", f"BIN={BIN}"],
                               cwd=ROOT, capture_output=True, text=True, timeout=1500)
    finally:
        native.wait(timeout=900)
    out = smoke.stdout + smoke.stderr
    assert smoke.returncode == 0, out[-6000:]
    run = ROOT / "runs" / run_id

    # nothing of the project is left on the engine, and the steps were timed
    report = json.loads((run / "compose-smoke.json").read_text())
    print(f"compose-smoke timings (s): {report['timings_s']}")  # shown with pytest -s
    assert report["left_behind"] == [], report
    for step in ("build", "up", "run", "finish", "down", "up_to_first_commit"):
        assert report["timings_s"][step] is not None and report["timings_s"][step] >= 0, (step, report)
    for argv in (["ps", "-a", "-q"], ["network", "ls", "-q"], ["volume", "ls", "-q"]):
        r = subprocess.run(["docker", *argv, "--filter", "label=com.docker.compose.project=xdc"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and r.stdout.strip() == "", (argv, r.stdout)

    # the person's view, from what `up` printed (smoke_check checked it too): progress lines in words, the
    # end, and a report path that exists on the host; `up` returned 0 by itself (the smoke fails otherwise)
    up_log = (run / "up.log").read_text(errors="replace")
    assert re.search(r"coordinator-1 +\| \S+ round \d+ committed by .*train loss \d+\.\d+", up_log), up_log[-3000:]
    assert re.search(r"coordinator-1 +\| \S+ run complete: [\d,]+ useful tokens", up_log), up_log[-3000:]
    below = re.findall(r"finish-1 +\| run \S+ complete: .*held-out NLL \d+\.\d+, (\d+\.\d+) nats below the bigram", up_log)
    assert below and float(below[-1]) >= 0.3, up_log[-3000:]  # the default compose recipe learns
    (report,) = re.findall(r"finish-1 +\| report: (\S+)", up_log)
    assert Path(report).resolve() == (run / "report" / "index.html").resolve() and Path(report).is_file()
    # Toxiproxy's healthcheck is silent and its output is not attached: no line of up's output comes from it
    # (compose's own "Container xdc-toxiproxy-1  Created" status lines name it and are fine)
    assert "GET /proxies" not in up_log and not re.search(r"^\s*toxiproxy-1\s+\|", up_log, re.M), up_log[-3000:]

    # the artifact, from the finish service: target reached, every checker passing, bytes reconciled
    art = json.loads((run / "artifact.json").read_text())
    (section,) = art["runs"]
    assert section["metrics"]["useful_tokens"]["value"] >= section["metrics"]["target_useful_tokens"]["value"]
    status = {c["name"]: c["status"] for c in art["checks"]}
    assert status.pop("same_frontier") in ("unknown", "pass")
    assert set(status.values()) == {"pass"}, status
    assert section["reconciliation"]["evidence"] == "measured" and section["reconciliation"]["proxy_total"] > 0
    # the sampler service: its raw trace, whole, hashed in the artifact; no meter here, so the run's energy
    # is `unavailable`, with the sensors' reasons (a GPU host would measure: then this part does not apply)
    trace = run / "logs" / "telemetry" / "trace.jsonl"
    assert trace.is_file(), sorted(p.name for p in (run / "logs").iterdir())
    energy = section["energy"]
    assert energy["sampler"]["ran"] and energy["trace"]["hash_matches"] and not energy["trace"]["truncated"], energy["trace"]
    assert energy["trace"]["sha256"] == hashlib.sha256(trace.read_bytes()).hexdigest()
    meters = {m["sensor"]: m for m in energy["meters"]}
    if not any(m["quantity"] in ("gpu_energy", "cpu_energy") and m["support"] == "ok" for m in meters.values()):
        m = section["metrics"]["energy"]
        assert m["evidence"] == "unavailable" and m["value"] is None, m
        assert "nvml0.energy" in m["reason"] and "rapl.energy" in m["reason"], m
        assert energy["gate"]["status"] == "unknown"
    assert {"a", "b", "c", "coord", "store"} <= set((energy.get("per_site") or {}).get("processes", {})), energy.get("per_site")
    chaos = [json.loads(l) for l in (run / "logs" / "chaos.jsonl").read_text().splitlines() if l.strip()]
    assert any(e.get("event") == "fault_injected" for e in chaos), [e.get("event") for e in chaos]

    # per-site networks, seen from inside site-a: no other process by name or address, nothing beyond
    # the project, Toxiproxy's proxies yes; and as the engine has them: internal, but for the relay of
    # Toxiproxy's API to the host
    # no secret key in the shared run directory: init moved each to its process's own volume
    assert sorted(p.name for p in (run / "keys" / "public").glob("*.key")) == sorted(
        f"{p}.key" for p in ("a", "b", "c", "coord", "store"))
    assert not list((run / "keys" / "private").glob("*")), list((run / "keys" / "private").glob("*"))
    probe = json.loads((run / "netprobe.json").read_text())
    assert set(probe["names"]) == set(probe["ips"]) == {"site-b", "site-c", "coordinator", "store"}
    assert not any(r["ok"] for r in [*probe["names"].values(), *probe["ips"].values(), *probe["outside"].values()])
    assert probe["via"]["ok"], probe
    nets = json.loads((run / "networks.json").read_text())
    assert {n for n, v in nets.items() if not v["internal"]} == {"net-toxiproxy-api"}, nets
    assert nets["net-toxiproxy-api"]["services"] == ["toxiproxy-api-relay"]
    # (`init` has exited by the time the engine is asked: an exited container is on no network)
    assert {"toxiproxy", "toxiproxy-api-relay"} <= set(nets["net-control"]["services"]) <= {
        "toxiproxy", "toxiproxy-api-relay", "init", "finish"}, nets
    # Toxiproxy's API does not answer from a site: by its name there (refused: it listens on the
    # control network only) nor by its alias on the control network (not even resolved)
    assert set(probe["api"]) == {"toxiproxy:8474", "toxiproxy-api:8474"}, probe
    assert not any(r["ok"] for r in probe["api"].values()), probe["api"]
    assert probe["api"]["toxiproxy-api:8474"]["address"] is None, probe["api"]
    assert nets["net-site-a"]["services"] == ["site-a", "toxiproxy"], nets

    # the native run of the same config and scenario ends at the same matched-frontier hash
    assert native.returncode is not None
    native_run = (native_runs / "latest").resolve()
    ns = json.loads((native_run / "summary.json").read_text())
    cs = json.loads((run / "summary.json").read_text())
    assert cs["frontier_hash"] and cs["frontier_hash"] == ns["frontier_hash"], (cs["frontier_hash"], ns["frontier_hash"])
    both = tmp_path / "both"
    r = subprocess.run([str(BIN / "xdc"), "analyze", str(run), str(native_run), "--out", str(both), "--no-report"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    pair = json.loads((both / "artifact.json").read_text())
    assert pair["comparison"]["matched_frontier"] is True
    assert {c["name"]: c["status"] for c in pair["checks"]}["same_frontier"] == "pass"
    shutil.rmtree(run, ignore_errors=True)  # 40 MB a run; a failing run stays in runs/ to be looked at
