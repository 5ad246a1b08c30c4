"""The verdict of `make compose-smoke` on a compose run directory (exit 1 and the reasons if any fail).

    python compose/smoke_check.py RUN [--native NATIVE_RUN]

Reads RUN/artifact.json (written by the `finish` service), RUN/netprobe.json (compose/netprobe.py
run inside site-a), RUN/networks.json and, with --up-log, what `docker compose up` printed, and checks:
  - the run reached its target of useful tokens;
  - no checker failed; `same_frontier` may be `unknown` (one run has nothing to compare with);
  - bytes: Toxiproxy's counters were read (evidence `measured`, a positive total) and the
    `byte_classes` checker reconciled every link with them;
  - every scheduled fault fired;
  - energy: the sampler service ran, its trace is whole and hashes to what it logged, the artifact
    names the hash, and the run's energy is `measured` or `unavailable` with the reason (never a
    bare number without a meter);
  - the probe: no other process resolvable or reachable from site-a, no address beyond the project
    reachable, nor Toxiproxy's API; Toxiproxy's proxies reachable;
  - the networks (RUN/networks.json, from docker network inspect): every per-process network is
    internal, the control network (Toxiproxy's API) carries no process, and the one network that is
    not internal has the API's relay alone on it;
  - with --native: the native run of the same config and scenario ends at the same matched-frontier
    hash (from both runs' summary.json);
  - with --up-log: the person's view: a commit line with a train loss, the completion line, the
    final NLL line, and a printed report path that exists on the host.
The decisions are pure functions of the loaded documents (`problems`), tested without an engine.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

# Checks that cannot be decided from one run without a scenario: nothing to compare the frontier with,
# no fault scheduled.
UNDECIDABLE_ALONE = {"same_frontier", "faults_fired"}


def artifact_problems(art: dict[str, Any]) -> list[str]:
    out = []
    (run,) = art["runs"]
    m = run["metrics"]
    if m["useful_tokens"]["value"] < m["target_useful_tokens"]["value"]:
        out.append(f"target not reached: {m['useful_tokens']['value']} of {m['target_useful_tokens']['value']} useful tokens")
    for c in art["checks"]:
        if c["status"] == "pass" or (c["status"] == "unknown" and c["name"] in UNDECIDABLE_ALONE):
            continue
        out.append(f"checker {c['name']}: {c['status']}: {c['summary']}")
    rec = run["reconciliation"]
    if rec.get("evidence") != "measured" or not rec.get("proxy_total"):
        out.append(f"bytes not reconciled with Toxiproxy's counters: {rec}")
    if not {c["name"] for c in art["checks"]} >= {"byte_classes", "faults_fired"}:
        out.append("the artifact lacks the byte_classes or faults_fired checker")
    return out


def energy_problems(art: dict[str, Any]) -> list[str]:
    """The sampler service's trace and the run's energy verdict (analysis/energy.py's section)."""
    (run,) = art["runs"]
    e = run.get("energy") or {}
    if not (e.get("sampler") or {}).get("ran"):
        return [f"no energy sampler ran in the compose run: {e.get('reason')}"]
    out = []
    tr = e.get("trace") or {}
    if not tr.get("sha256") or not tr.get("hash_matches") or tr.get("truncated"):
        out.append(f"the sampler's trace is not whole: sha256 {tr.get('sha256')}, matches the logged one "
                   f"{tr.get('hash_matches')}, truncated {tr.get('truncated')}, problems {tr.get('problems')}")
    m = run["metrics"].get("energy") or {}
    if m.get("evidence") == "unavailable":
        if not m.get("reason"):
            out.append("the run's energy is unavailable without a reason")
    elif m.get("evidence") != "measured" or m.get("value") is None:
        out.append(f"the run's energy is neither measured nor unavailable with a reason: {m}")
    return out


def probe_problems(probe: dict[str, Any]) -> list[str]:
    out = []
    if not probe["names"] or not probe["ips"]:
        out.append("the probe tried no other process")
    for name, r in probe["names"].items():
        if r["ok"] or r["address"] is not None:
            out.append(f"site-a resolves or reaches {name} by name ({r})")
    for svc, r in probe["ips"].items():
        if r["ok"]:
            out.append(f"site-a reaches {svc} directly at {r['address']}")
    for target, r in probe.get("outside", {}).items():
        if r["ok"]:
            out.append(f"site-a reaches {target}, beyond the project")
    if not probe.get("api"):
        out.append("the probe did not try Toxiproxy's API")
    for target, r in probe.get("api", {}).items():
        if r["ok"]:
            out.append(f"site-a reaches Toxiproxy's API at {target} (it must listen on the control network only)")
    if not probe["via"]["ok"]:
        out.append(f"site-a cannot reach Toxiproxy at {probe['via']['target']}: {probe['via']['error']}")
    return out


def network_problems(networks: dict[str, dict[str, Any]], api_network: str = "net-toxiproxy-api",
                     control_network: str = "net-control") -> list[str]:
    """networks: compose network name -> {"internal": bool, "services": [service, ...]}. Every network
    internal but the API's, which carries the relay of Toxiproxy's API alone; the control network
    (Toxiproxy's API) carries Toxiproxy, the relay, init and finish, and no process."""
    out = []
    if api_network not in networks or control_network not in networks or len(networks) < 3:
        out.append(f"unexpected networks: {sorted(networks)}")
    for name, n in networks.items():
        if name == api_network:
            if n["services"] != ["toxiproxy-api-relay"]:
                out.append(f"{name} (not internal) carries {n['services']}, not the API's relay alone")
        elif not n["internal"]:
            out.append(f"network {name} is not internal")
        elif name == control_network and not set(n["services"]) <= {"toxiproxy", "toxiproxy-api-relay", "init", "finish"}:
            out.append(f"{name} (Toxiproxy's API) carries {n['services']}")
    return out


def frontier_problems(compose_summary: dict[str, Any], native_summary: dict[str, Any]) -> list[str]:
    c, n = compose_summary.get("frontier_hash"), native_summary.get("frontier_hash")
    if not c or c != n:
        return [f"matched-frontier hash differs: compose {c} (round {compose_summary.get('frontier_round')}), "
                f"native {n} (round {native_summary.get('frontier_round')})"]
    return []


COMMIT_LINE = re.compile(r"round \d+ committed by .*train loss \d+\.\d+")
REPORT_LINE = re.compile(r"^\S*\s*\|?\s*report: (\S+)", re.M)


def output_problems(up_text: str) -> list[str]:
    """What `docker compose up` showed a person: progress in words, the end, and where the report is."""
    out = []
    if not COMMIT_LINE.search(up_text):
        out.append("no line says a round was committed with its train loss")
    if "run complete:" not in up_text:
        out.append("no line says the run is complete")
    if "held-out NLL" not in up_text:
        out.append("no line gives the final held-out NLL")
    reports = REPORT_LINE.findall(up_text)
    if not reports:
        out.append("no line says where the report is")
    elif not Path(reports[-1]).is_file():
        out.append(f"the printed report path {reports[-1]} does not exist on the host")
    return out


def problems(run: Path, native: Path | None = None, up_log: Path | None = None) -> list[str]:
    art = json.loads((run / "artifact.json").read_text())
    out = artifact_problems(art) + energy_problems(art)
    out += probe_problems(json.loads((run / "netprobe.json").read_text()))
    out += network_problems(json.loads((run / "networks.json").read_text()))
    if up_log is not None:
        out += output_problems(up_log.read_text(errors="replace"))
    if native is not None:
        out += frontier_problems(json.loads((run / "summary.json").read_text()),
                                 json.loads((native / "summary.json").read_text()))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--native", type=Path, help="a native run of the same config and scenario")
    ap.add_argument("--up-log", type=Path, help="what `docker compose up` printed")
    args = ap.parse_args(argv)
    found = problems(args.run, args.native, args.up_log)
    art = json.loads((args.run / "artifact.json").read_text())
    s = json.loads((args.run / "summary.json").read_text())
    print(f"compose-smoke: {args.run}: useful tokens {art['runs'][0]['metrics']['useful_tokens']['value']}, "
          f"checks {', '.join(c['name'] + '=' + c['status'] for c in art['checks'])}, "
          f"frontier round {s.get('frontier_round')} hash {s.get('frontier_hash')}"
          + (" (= native)" if args.native and not any("frontier" in p for p in found) else ""))
    for p in found:
        print(f"compose-smoke: FAIL: {p}", file=sys.stderr)
    if not found:
        print(f"compose-smoke: pass; report {args.run / 'report' / 'index.html'}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
