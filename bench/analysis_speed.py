"""Benchmark: `xdc analyze` on the logs of a run with one million events.

A run that long takes hours on a laptop, so the history is synthesised with the shape of a real
one (tests/test_analysis.py checks the analysis on real runs): three sites, DiLoCo rounds of H=8
inner steps, per-step `work_attempted` with canonical sample ids, compute/collective spans,
commits with lineage, durable checkpoints every 4 rounds, cumulative WAN counters, heartbeats,
a site crash at mid-run with elastic recovery (lost work, an epoch change, a rejoin by state
transfer from a donor) and Toxiproxy's counters at the end. Every checker must pass on it (so the
analysis cannot be fast by skipping work).

Measured side by side in one run:
  parse_s    reading and JSON-parsing every line of the logs, nothing else (the floor; in-process)
  artifact_s `xdc analyze RUN --no-report` in a fresh process: load + ledgers + timelines + all
             checkers + schema validation + artifact.json
  full_s     `xdc analyze RUN` in a fresh process: all of that plus report/index.html and the
             on-demand trace files
Result: ratio = full_s / 60 s (goal <= 0.5: "well under a minute"); the raw numbers include
full_s / parse_s, the analysis's cost relative to just reading its input.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import ROOT, env_info, write_result

SITES = ("a", "b", "c")
H = 8  # inner steps per round
BATCH = 8  # samples per inner step per site
SEQ = 128  # tokens per sample
FLOPS_PER_TOKEN = 5_832_704.0
ROUND_NS = 1_000_000_000
CKPT_EVERY = 4
RUN_ID = "bench-1m"


class Log:
    def __init__(self, path: Path, process: str) -> None:
        self.f = open(path, "w")
        self.process = process
        self.seq = 0

    def emit(self, event: str, wall_ns: int, pid: int, epoch: int, **fields: Any) -> dict[str, Any]:
        e = {"id": f"{self.process}:{self.seq}", "event": event, "wall_ns": wall_ns, "mono_ns": wall_ns - 10**18,
             "run_id": RUN_ID, "process": self.process, "pid": pid, "epoch": epoch, "step": 0, **fields}
        self.seq += 1
        self.f.write(json.dumps(e, separators=(",", ":")) + "\n")
        return e

    def span(self, event: str, start_ns: int, end_ns: int, pid: int, epoch: int, **fields: Any) -> None:
        self.emit(event, end_ns, pid, epoch, start_wall_ns=start_ns, end_wall_ns=end_ns,
                  start_mono_ns=start_ns - 10**18, end_mono_ns=end_ns - 10**18, **fields)


def _h(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def synth_run(run_dir: Path, target_events: int) -> int:
    """Write a consistent run directory of about `target_events` events; returns the count."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    rounds = max(40, target_events // 45)
    fail_at, rejoin_at = rounds // 2, rounds // 2 + 10
    cfg = {"run_id": RUN_ID, "cluster": {"sites": list(SITES)}, "model": {"seq_len": SEQ},
           "train": {"mode": "local", "target_useful_tokens": 0}, "recovery": {"policy": "elastic"}}
    topo = {"links": {f"{x}_to_{y}": {} for x in SITES for y in (*SITES, "coord", "store") if x != y}}
    logs = {p: Log(run_dir / "logs" / f"{p}.jsonl", p) for p in ("launcher", "coord", "store", "chaos", *SITES)}
    t = 1_790_000_000_000_000_000
    L = logs["launcher"]
    L.emit("process_started", t, 1, 0, name="toxiproxy", child_pid=2)
    L.emit("run_started", t, 1, 0, code_revision={"commit": "0" * 40, "dirty": False, "evidence": "measured"},
           runtime={"python": sys.version.split()[0]}, argv=["bench"])
    for link in topo["links"]:
        L.emit("proxy_created", t, 1, 0, proxy=link, listen="127.0.0.1:1", upstream="127.0.0.1:2", toxics=[])
    pid = {"coord": 10, "store": 11, "a": 20, "b": 21, "c": 22}
    C, S = logs["coord"], logs["store"]
    C.emit("coordinator_started", t, pid["coord"], 0, expected_sites=list(SITES), policy="elastic")
    S.emit("store_started", t, pid["store"], 0)
    init_hash = _h("init")
    for s in SITES:
        logs[s].emit("site_started", t, pid[s], 0, device="cpu", dataset_id=_h("data"), n_params=842_496,
                     flops_per_token=FLOPS_PER_TOKEN, params_hash=init_hash, torch="2.x")
    epoch, members = 1, list(SITES)
    C.emit("membership_epoch", t, pid["coord"], 1, members=members, start_round=0, start_cursor=0, restore="none",
           joiners=[], donor=None)
    for s in SITES:
        logs[s].emit("membership", t, pid[s], 1, members=members)
    counters: dict[str, dict[tuple[str, str], int]] = {p: {} for p in (*SITES, "coord", "store")}
    cursor, parent, last_ckpt, commit_hash = 0, None, None, init_hash
    # The synthetic canonical order is the identity, so the retained set after a commit is range(0, cursor):
    # its hash (sorted ids as int64 little-endian, the sites' samples_sha256) grows with each commit.
    retained_hasher, hashed_to = hashlib.sha256(), 0
    # The schedule the chaos log announces: one crash of b, the one fault_injected below (fault 0).
    logs["chaos"].emit("scenario_started", t, 5, 1, scenario="bench-synthetic", seed=0, n_faults=1,
                       faults=[{"kind": "site_crash", "target": "b", "at_step": fail_at * H, "params": {}}])
    fence = 1

    link_total: dict[str, int] = {}  # what Toxiproxy will have seen per link, over every incarnation

    def count(proc: str, link: str, cls: str, n: int) -> None:
        counters[proc][(link, cls)] = counters[proc].get((link, cls), 0) + n
        link_total[link] = link_total.get(link, 0) + n

    def snapshot(proc: str, now: int, ep: int) -> None:
        rows = [{"side": "tx", "link": lk, "direction": "up", "cls": c, "bytes": b, "messages": 1}
                for (lk, c), b in counters[proc].items()]
        logs[proc].emit("wan_counters", now, pid[proc], ep, counters=rows)

    r = 0
    while r < rounds:
        t0 = t + r * ROUND_NS
        if r == fail_at and epoch == 1:
            # b crashes mid-round: its work and the survivors' work of this round are lost.
            logs["chaos"].emit("fault_injected", t0 + 1000, 5, 1, kind="site_crash", target="b", fault=0)
            start_cursor = cursor
            for i, s in enumerate(SITES):
                for k in range(H):
                    base = start_cursor + (i * H + k) * BATCH
                    logs[s].emit("work_attempted", t0 + 2000 + k, pid[s], 1, round=r, inner_step=k,
                                 samples=list(range(base, base + BATCH)), tokens=BATCH * SEQ,
                                 flops=BATCH * SEQ * FLOPS_PER_TOKEN * 3)
            C.emit("site_failed", t0 + 500_000_000, pid["coord"], 1, site="b", reason="no heartbeat")
            epoch, members = 2, ["a", "c"]
            C.emit("membership_epoch", t0 + 600_000_000, pid["coord"], 2, members=members, start_round=r,
                   start_cursor=cursor, restore="none", joiners=[], donor=None)
            S.emit("store_fence_raised", t0 + 600_000_001, pid["store"], 0, fence_epoch=2)
            fence = 2
            for s in members:
                logs[s].emit("membership", t0 + 700_000_000, pid[s], 2, members=members)
                logs[s].span("restore", t0 + 700_000_000, t0 + 710_000_000, pid[s], 2, kind="none",
                             start_round=r, rolled_back=True, from_round=r + 1)
            t += ROUND_NS  # the recovery took a round's time
            t0 = t + r * ROUND_NS
        if r == rejoin_at and epoch == 2:
            pid["b"] = 31  # the restarted process: its counters start from zero
            counters["b"] = {}
            logs["b"].emit("site_started", t0, pid["b"], 0, device="cpu", dataset_id=_h("data"), n_params=842_496,
                           flops_per_token=FLOPS_PER_TOKEN, params_hash=init_hash, torch="2.x")
            epoch, members = 3, list(SITES)
            C.emit("membership_epoch", t0 + 1000, pid["coord"], 3, members=members, start_round=r,
                   start_cursor=cursor, restore="donor", joiners=["b"], donor="a")
            S.emit("store_fence_raised", t0 + 1001, pid["store"], 0, fence_epoch=3)
            fence = 3
            for s in SITES:
                logs[s].emit("membership", t0 + 2000, pid[s], 3, members=members)
            logs["a"].emit("state_sent", t0 + 3000, pid["a"], 3, joiner="b", bytes=10_000_000,
                           params_hash=commit_hash, round=r)
            logs["a"].span("restore", t0 + 2500, t0 + 4000, pid["a"], 3, kind="donor", start_round=r, sent_to=["b"])
            count("a", "a_to_b", "state_transfer", 10_000_000)
            logs["b"].emit("state_received", t0 + 5000, pid["b"], 3, donor="a", bytes=10_000_000,
                           params_hash=commit_hash, round=r)
            logs["b"].span("restore", t0 + 2500, t0 + 6000, pid["b"], 3, kind="donor", start_round=r,
                           source="donor", donor="a", params_hash=commit_hash)
        tokens = {}
        for i, s in enumerate(members):
            for k in range(H):
                base = cursor + (i * H + k) * BATCH
                logs[s].emit("work_attempted", t0 + 10_000 + k * 1000, pid[s], epoch, round=r, inner_step=k,
                             samples=list(range(base, base + BATCH)), tokens=BATCH * SEQ,
                             flops=BATCH * SEQ * FLOPS_PER_TOKEN * 3)
            tokens[s] = H * BATCH * SEQ
            logs[s].span("compute", t0, t0 + 600_000_000, pid[s], epoch, round=r, loss=3.0, samples=H * BATCH)
            logs[s].span("collective", t0 + 600_000_000, t0 + 900_000_000, pid[s], epoch, round=r,
                         payload_values=842_496, payload_bytes_sent=4_493_312)
            for o in members:
                if o != s:
                    count(s, f"{s}_to_{o}", "collective", 4_493_312 // (len(members) - 1))
            count(s, f"{s}_to_coord", "control", 620)
            count(s, f"{s}_to_coord", "telemetry", 300)
            logs[s].emit("round_done", t0 + 910_000_000, pid[s], epoch, round=r, param_hash=_h(r), cursor_start=cursor,
                         cursor_end=cursor + len(members) * H * BATCH)
            snapshot(s, t0 + 910_000_001, epoch)
            if r % CKPT_EVERY == 0:
                logs[s].span("eval", t0 + 920_000_000, t0 + 930_000_000, pid[s], epoch, round=r,
                             heldout_nll=5.4 - 2.0 * r / rounds, useful_tokens_trained=cursor * SEQ)
        end = cursor + len(members) * H * BATCH
        cid = f"e{epoch}r{r}"
        commit_hash = _h(r)
        C.emit("commit", t0 + 950_000_000, pid["coord"], epoch, commit_id=cid, parent=parent, round=r,
               members=list(members), param_hash=commit_hash, cursor_start=cursor, cursor_end=end, tokens=tokens)
        for s in members:
            C.emit("site_metrics", t0 + 950_000_001, pid["coord"], epoch, site=s, round=r, loss=3.0)
        C.emit("heartbeat_stats", t0 + 950_000_002, pid["coord"], epoch, sites={s: {"n": 5} for s in members})
        parent, cursor = cid, end
        if r % CKPT_EVERY == CKPT_EVERY - 1:
            mh = _h("ckpt", r)
            retained_hasher.update(np.arange(hashed_to, end, dtype="<i8").tobytes())
            hashed_to = end
            retained_sha = retained_hasher.copy().hexdigest()
            logs["a"].span("checkpoint_write", t0 + 960_000_000, t0 + 990_000_000, pid["a"], epoch, round=r,
                           manifest_hash=mh, samples_sha256=retained_sha, canonical_sha256=retained_sha, cursor=end)
            count("a", "a_to_store", "checkpoint", 16_000_000)
            S.emit("checkpoint_durable", t0 + 985_000_000, pid["store"], max(epoch, fence), manifest_hash=mh,
                   ckpt_id=cid, round=r, parent=last_ckpt, bytes=16_000_000)
            C.emit("frontier", t0 + 990_000_000, pid["coord"], epoch, round=r, cursor=end, manifest_hash=mh,
                   commit_id=cid)
            last_ckpt = mh
        r += 1
    end_t = t + rounds * ROUND_NS
    for s in SITES:
        snapshot(s, end_t, epoch)  # the last counters, after the last checkpoint write
        logs[s].emit("target_reached", end_t, pid[s], epoch)
    # Toxiproxy's view: every byte the senders put on each link, plus handshake/heartbeat framing.
    L.emit("proxy_counters", end_t, 1, 0, proxies={lk: {"upstream": b + 1500, "downstream": 0}
                                                  for lk, b in link_total.items()})
    for lg in logs.values():
        lg.f.close()
    (run_dir / "config.json").write_text(json.dumps(cfg))
    (run_dir / "topology.json").write_text(json.dumps(topo))
    return sum(lg.seq for lg in logs.values())


def parse_only(run_dir: Path) -> int:
    from analysis.load import _loads

    n = 0
    for p in sorted((run_dir / "logs").glob("*.jsonl")):
        with open(p, "rb") as f:
            for line in f:
                _loads(line)
                n += 1
    return n


def _xdc_analyze(run: Path, out: Path, *, report: bool) -> tuple[float, dict[str, Any]]:
    """`xdc analyze` as a user runs it: a fresh process (imports included); wall seconds + artifact."""
    cmd = [sys.executable, "-m", "xdc.cli", "analyze", str(run), "--out", str(out)] + ([] if report else ["--no-report"])
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t
    # 1 = a checker failed: still measured, reported below. A traceback also exits 1: no artifact then.
    if proc.returncode not in (0, 1) or not (out / "artifact.json").exists():
        raise RuntimeError(f"xdc analyze failed (exit {proc.returncode}, no artifact): {proc.stderr[-2000:]}")
    return wall, json.loads((out / "artifact.json").read_text())


def main() -> int:
    target = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    with tempfile.TemporaryDirectory(prefix="xdc-bench-analysis-") as tmp:
        run = Path(tmp) / RUN_ID
        t = time.perf_counter()
        n = synth_run(run, target)
        synth_s = time.perf_counter() - t
        size = sum(p.stat().st_size for p in (run / "logs").glob("*.jsonl"))
        t = time.perf_counter()
        parse_only(run)
        parse_s = time.perf_counter() - t
        artifact_s, art = _xdc_analyze(run, Path(tmp) / "artifact-only", report=False)
        full_s, art_full = _xdc_analyze(run, Path(tmp) / "full", report=True)
        report_mb = (Path(tmp) / "full" / "report" / "index.html").stat().st_size / 1e6
    assert art["runs"][0]["n_events"] == n
    checks = {c["name"]: c["status"] for c in art_full["checks"]}
    ok_checks = all(v == "pass" for k, v in checks.items() if k != "same_frontier")
    ratio = full_s / 60.0
    write_result(
        "analysis_speed", ratio=ratio, goal="<= 0.5 (1M events analysed well under a minute)",
        passed=ratio <= 0.5 and ok_checks,
        raw={"events": n, "log_bytes": size, "synthesis_s": synth_s, "parse_s": parse_s, "artifact_s": artifact_s,
             "full_s": full_s, "full_over_parse": full_s / parse_s, "artifact_over_parse": artifact_s / parse_s,
             "events_per_s": n / full_s, "report_mb": report_mb,
             "analysis_s_in_artifact": art_full["generated"].get("analysis_s"), "checks": checks},
        env=env_info("n/a"), reference="fixed_goal", measures=["analysis/", "bench/analysis_speed.py"],
        notes="ratio = wall time of `xdc analyze RUN` (a fresh process: imports, load, ledgers, checkers, artifact, "
              "report) on a synthetic ~1M-event run / 60 s; parse_s (read + JSON-parse every line, in this process) "
              "is the floor, measured in the same run")
    print(f"{n:,} events ({size / 1e6:.0f} MB): parse {parse_s:.1f} s, `xdc analyze --no-report` {artifact_s:.1f} s, "
          f"`xdc analyze` {full_s:.1f} s; checks {checks}")
    return 0 if ok_checks and ratio <= 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
