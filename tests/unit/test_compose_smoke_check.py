"""The verdicts of the compose smoke (compose/smoke_check.py, compose/netprobe.py), as pure functions on
documents shaped like the real ones: what passes, and each way it must fail. No engine needed."""

from __future__ import annotations

import copy
from pathlib import Path

from tests.helpers_compose_smoke_check import _load, netprobe


check = _load("smoke_check")

ART = {"runs": [{"metrics": {"useful_tokens": {"value": 131072}, "target_useful_tokens": {"value": 131072}},
                 "reconciliation": {"evidence": "measured", "proxy_total": 105990180}}],
       "checks": [{"name": n, "status": "pass", "summary": ""} for n in
                  ("log_integrity", "fencing", "work_ledger", "byte_classes", "lineage", "no_fresh_overwrite",
                   "faults_fired")] + [{"name": "same_frontier", "status": "unknown", "summary": "one run"}]}
FAIL = {"ok": False, "error": "gaierror: [Errno -2] Name or service not known", "address": None}
PROBE = {"names": {"site-b": FAIL}, "ips": {"site-b": {"address": "172.20.0.3", "ok": False, "error": "unreachable"}},
         "outside": {"10.255.255.53:53": {"ok": False, "error": "TimeoutError: timed out"}},
         "via": {"target": "toxiproxy:20000", "ok": True, "error": None, "address": "172.19.0.2"},
         "api": {"toxiproxy:8474": {"ok": False, "error": "ConnectionRefusedError: refused", "address": "172.19.0.2"},
                 "toxiproxy-api:8474": FAIL},
         "default_route": True}
NETS = {"net-site-a": {"internal": True, "services": ["site-a", "toxiproxy"]},
        "net-coordinator": {"internal": True, "services": ["coordinator", "toxiproxy"]},
        "net-control": {"internal": True, "services": ["finish", "init", "toxiproxy", "toxiproxy-api-relay"]},
        "net-toxiproxy-api": {"internal": False, "services": ["toxiproxy-api-relay"]}}


def test_a_good_run_passes() -> None:
    assert check.artifact_problems(ART) == []
    assert check.probe_problems(PROBE) == []
    assert check.network_problems(NETS) == []
    assert check.frontier_problems({"frontier_hash": "ab"}, {"frontier_hash": "ab"}) == []


def test_each_artifact_failure_is_named() -> None:
    short = copy.deepcopy(ART)
    short["runs"][0]["metrics"]["useful_tokens"]["value"] = 65536
    assert "target not reached" in check.artifact_problems(short)[0]
    failed = copy.deepcopy(ART)
    failed["checks"][0]["status"] = "fail"
    assert check.artifact_problems(failed)[0].startswith("checker log_integrity: fail")
    unknown = copy.deepcopy(ART)
    unknown["checks"][3]["status"] = "unknown"  # byte_classes may not be unknown; same_frontier may
    assert check.artifact_problems(unknown)[0].startswith("checker byte_classes: unknown")
    unmeasured = copy.deepcopy(ART)
    unmeasured["runs"][0]["reconciliation"] = {"evidence": "unavailable", "proxy_total": None}
    assert "not reconciled" in check.artifact_problems(unmeasured)[0]


ENERGY = {"sampler": {"ran": True}, "trace": {"sha256": "ab" * 32, "hash_matches": True, "truncated": False,
                                              "problems": []}}
UNAVAILABLE = {"value": None, "unit": "J", "evidence": "unavailable",
               "reason": "no energy meter readable: nvml0.energy: no_library; rapl.energy: no_device"}


def test_the_sampler_service_energy_verdicts() -> None:
    good = copy.deepcopy(ART)
    good["runs"][0]["energy"] = ENERGY
    good["runs"][0]["metrics"]["energy"] = UNAVAILABLE
    assert check.energy_problems(good) == []
    measured = copy.deepcopy(good)
    measured["runs"][0]["metrics"]["energy"] = {"value": 1234.5, "unit": "J", "evidence": "measured"}
    assert check.energy_problems(measured) == []
    absent = copy.deepcopy(good)
    absent["runs"][0]["energy"] = {"sampler": {"ran": False}, "reason": "no telemetry sampler ran in this run"}
    assert "no energy sampler ran" in check.energy_problems(absent)[0]
    torn = copy.deepcopy(good)
    torn["runs"][0]["energy"]["trace"]["truncated"] = True
    assert "trace is not whole" in check.energy_problems(torn)[0]
    bare = copy.deepcopy(good)
    bare["runs"][0]["metrics"]["energy"] = {"value": None, "unit": "J", "evidence": "unavailable", "reason": ""}
    assert "without a reason" in check.energy_problems(bare)[0]
    modeled = copy.deepcopy(good)
    modeled["runs"][0]["metrics"]["energy"] = {"value": 99.0, "unit": "J", "evidence": "modeled"}
    assert "neither measured nor unavailable" in check.energy_problems(modeled)[0]


def test_each_probe_failure_is_named() -> None:
    reached = copy.deepcopy(PROBE)
    reached["ips"]["site-b"]["ok"] = True
    assert "reaches site-b directly" in check.probe_problems(reached)[0]
    resolved = copy.deepcopy(PROBE)
    resolved["names"]["site-b"]["address"] = "172.20.0.3"
    assert "by name" in check.probe_problems(resolved)[0]
    escaped = copy.deepcopy(PROBE)
    escaped["outside"]["10.255.255.53:53"]["ok"] = True
    assert "beyond the project" in check.probe_problems(escaped)[0]
    api = copy.deepcopy(PROBE)
    api["api"]["toxiproxy:8474"]["ok"] = True
    assert "reaches Toxiproxy's API at toxiproxy:8474" in check.probe_problems(api)[0]
    assert "did not try Toxiproxy's API" in check.probe_problems(dict(PROBE, api={}))[0]
    cut_off = copy.deepcopy(PROBE)
    cut_off["via"]["ok"] = False
    assert "cannot reach Toxiproxy" in check.probe_problems(cut_off)[0]
    assert check.probe_problems(dict(PROBE, names={}, ips={}))


def test_each_network_failure_is_named() -> None:
    open_net = copy.deepcopy(NETS)
    open_net["net-site-a"]["internal"] = False
    assert check.network_problems(open_net) == ["network net-site-a is not internal"]
    crowded = copy.deepcopy(NETS)
    crowded["net-toxiproxy-api"]["services"] = ["site-a", "toxiproxy-api-relay"]
    assert "not the API's relay alone" in check.network_problems(crowded)[0]
    control = copy.deepcopy(NETS)
    control["net-control"]["services"].append("site-a")
    assert "(Toxiproxy's API) carries" in check.network_problems(control)[0]
    assert check.network_problems({"net-site-a": NETS["net-site-a"]})


def test_frontier_hash_must_match_and_exist() -> None:
    assert check.frontier_problems({"frontier_hash": "ab"}, {"frontier_hash": "cd"})
    assert check.frontier_problems({"frontier_hash": None}, {"frontier_hash": None})


def test_default_route_is_read_from_the_routing_table() -> None:
    head = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
    own_subnet = "eth0\t000014AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n"
    default = "eth1\t00000000\t010011AC\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
    assert not netprobe.has_default_route(head + own_subnet)
    assert netprobe.has_default_route(head + own_subnet + default)


def test_the_probe_runs_its_attempts_at_once_and_bounds_the_stragglers() -> None:
    """run_all starts every attempt together (four that each wait for all four at a barrier all
    succeed), records one that raises as a failed attempt, and one still running at the deadline
    as a timeout instead of waiting for it."""
    import threading

    barrier = threading.Barrier(4)
    release = threading.Event()

    def together() -> dict:
        barrier.wait(timeout=20)  # BrokenBarrierError unless all four run at the same time
        return {"ok": True, "error": None}

    def raises() -> dict:
        raise ValueError("bad attempt")

    def stuck() -> dict:
        release.wait(30)
        return {"ok": True, "error": None}

    tasks = {f"t{i}": together for i in range(4)} | {"raises": raises, "stuck": stuck}
    try:
        out = netprobe.run_all(tasks, deadline_s=3.0)
    finally:
        release.set()
    assert all(out[f"t{i}"] == {"ok": True, "error": None} for i in range(4))
    assert out["raises"] == {"ok": False, "error": "ValueError: bad attempt"}
    assert out["stuck"] == {"ok": False, "error": "timeout: no answer in 3.0 s"}


def test_what_up_printed_passes_with_progress_the_end_and_a_report_that_exists(tmp_path: Path) -> None:
    report = tmp_path / "r1" / "report" / "index.html"
    report.parent.mkdir(parents=True)
    report.write_text("<html></html>")
    up = ("coordinator-1  | 07:10:01 round 3 committed by a, b, c: 98,304 of 1,179,648 useful tokens (8 %), train loss 2.413\n"
          "coordinator-1  | 07:11:40 run complete: 1,179,648 useful tokens in 48 commits (tip e3r47)\n"
          "finish-1       | run r1 complete: 1,179,648 useful tokens; held-out NLL 2.010, 0.47 nats below the bigram ...\n"
          f"finish-1       | report: {report} (open it in a browser)\n")
    assert check.output_problems(up) == []
    # each way it must fail: no loss on the commit line, no end, no NLL, a report that is not on the host
    assert check.output_problems(up.replace(", train loss 2.413", "")) == \
        ["no line says a round was committed with its train loss"]
    assert check.output_problems(up.replace("run complete:", "run over:")) == ["no line says the run is complete"]
    assert check.output_problems(up.replace("held-out NLL", "NLL")) == ["no line gives the final held-out NLL"]
    assert check.output_problems(up.replace(str(report), "/runs/r1/report/index.html")) == \
        ["the printed report path /runs/r1/report/index.html does not exist on the host"]
    assert check.output_problems(up.replace("report:", "see")) == ["no line says where the report is"]
