"""What a soak run must prove before it counts as passed, and what its faults caused.

Every check reads the run directory (logs, store, summary) after the run, never a live process:

  reached_target      the run's useful tokens equal the target (in whole site batches)
  checkers            every checker of `xdc analyze` passes on the run (`unknown` is not a pass);
                      `same_frontier` needs several runs, so the soak judges it per schedule
  clean_exit          every process the launcher ran last exited 0, nothing was interrupted, and
                      the run ended by itself (not stopped by the launcher's timeout)
  checkpoints         every manifest and blob in the store re-verifies by hash, and every durable
                      checkpoint, reloaded from the store into a fresh model, hashes to the
                      parameters its manifest names
  frontier_is_tip     the store's frontier holds the state of the last commit (same parameter hash,
                      round and cursor)
  faults_logged       every fault the driver says fired has its `fault_injected` in chaos.jsonl
                      (same index, kind and target); every progress-triggered fault fired; no
                      injection failed and every fault was healed (a heal that failed and then
                      succeeded on a retry is noted)

`recoveries` lists, from the logs, what the cluster did about its faults (failures detected,
epochs formed and how state was restored, rejoins, coordinator recoveries, collectives aborted,
checkpoints refused) and attributes each to the faults in force when it happened.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ground.eventlog import read_events

PER_RUN_EXEMPT = frozenset({"same_frontier"})  # needs several runs: judged per schedule


@dataclass(frozen=True)
class Verdict:
    """One check on one run: ok, with a reason when not (and a detail either way)."""

    name: str
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class RunJudgement:
    verdicts: tuple[Verdict, ...]
    checks: dict[str, str] = field(default_factory=dict)  # checker name -> status

    @property
    def passed(self) -> bool:
        return all(v.ok for v in self.verdicts)

    @property
    def reasons(self) -> list[str]:
        return [f"{v.name}: {v.detail}" for v in self.verdicts if not v.ok]


def _logs(run_dir: Path, process: str) -> list[dict[str, Any]]:
    path = run_dir / "logs" / f"{process}.jsonl"
    return read_events(path) if path.exists() else []


# ------------------------------------------------------------------------------------ checks


def reached_target(summary: dict[str, Any], target_tokens: int) -> Verdict:
    got = summary.get("useful_tokens")
    return Verdict("reached_target", got == target_tokens, f"{got} of {target_tokens} useful tokens")


def clean_exit(summary: dict[str, Any]) -> Verdict:
    ok = bool(summary.get("clean_exit")) and not summary.get("interrupted") and not summary.get("timed_out")
    return Verdict("clean_exit", ok, f"exit codes {summary.get('exit_codes')}, interrupted "
                                     f"{bool(summary.get('interrupted'))}, stopped by the launcher's timeout "
                                     f"{bool(summary.get('timed_out'))}")


def analysis_checks(run_dir: Path) -> tuple[Verdict, dict[str, str]]:
    """`xdc analyze` of the run alone (artifact.json in the run directory, no report)."""
    from analysis.analyze import analyze

    try:
        art = analyze([run_dir], run_dir / "analysis", report=False).artifact
    except Exception as e:  # the analysis itself failing is a failed run, with the error
        return Verdict("checkers", False, f"xdc analyze raised {type(e).__name__}: {e}"), {}
    statuses = {c["name"]: c["status"] for c in art["checks"]}
    bad = [f"{c['name']}={c['status']} ({c['summary']}; {'; '.join(c['evidence'][:2])})" for c in art["checks"]
           if c["name"] not in PER_RUN_EXEMPT and c["status"] != "pass"]
    return Verdict("checkers", not bad, "; ".join(bad) or f"{len(statuses)} checkers: all pass"), statuses


def _reload_hash(store: Any, manifest: dict[str, Any], cfg: Any) -> str:
    """Load a checkpoint's model blob from the store into a fresh model; its params_hash."""
    import safetensors.torch
    import torch

    from site_agent.model import build_model, params_hash

    model = build_model(cfg.model, cfg.train.seed)
    tensors = safetensors.torch.load(store.get_blob(manifest["blobs"]["model"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(tensors[name])
    return params_hash(model)


def checkpoints(run_dir: Path) -> Verdict:
    """Every manifest and blob re-verifies; every durable checkpoint reloads to its params_hash."""
    from checkpoint_store.blobstore import BlobStore, StoreError
    from ground.config import load_config

    cfg = load_config(json.loads((run_dir / "config.json").read_text()))
    durable = [e["manifest_hash"] for e in _logs(run_dir, "store") if e.get("event") == "checkpoint_durable"]
    try:
        store = BlobStore(run_dir / "store")
        manifests = store.manifests()
        for m in manifests.values():
            for sha in m["blobs"].values():
                store.verify_blob(sha)
        bad = []
        for h in dict.fromkeys(durable):
            if h not in manifests:
                bad.append(f"durable {h[:12]} has no manifest in the store")
            elif _reload_hash(store, manifests[h], cfg) != manifests[h]["params_hash"]:
                bad.append(f"durable {h[:12]} (round {manifests[h]['round']}) reloads to another params_hash")
    except (StoreError, OSError, KeyError, ValueError, RuntimeError) as e:
        return Verdict("checkpoints", False, f"{type(e).__name__}: {e}")
    if not durable:
        return Verdict("checkpoints", False, "no durable checkpoint in the store's log")
    detail = f"{len(manifests)} manifests and their blobs verified; {len(set(durable))} durable reloaded"
    return Verdict("checkpoints", not bad, "; ".join(bad) or detail)


def frontier_is_tip(run_dir: Path) -> Verdict:
    from checkpoint_store.blobstore import BlobStore, StoreError

    commits = [e for e in _logs(run_dir, "coord") if e.get("event") == "commit"]
    if not commits:
        return Verdict("frontier_is_tip", False, "no commit in coord.jsonl")
    tip = commits[-1]
    try:
        fr = BlobStore(run_dir / "store").frontier()
    except (StoreError, OSError) as e:
        return Verdict("frontier_is_tip", False, f"{type(e).__name__}: {e}")
    if fr is None:
        return Verdict("frontier_is_tip", False, "the store has no frontier")
    m = fr[1]
    same = (m.get("params_hash") == tip.get("param_hash") and m.get("round") == tip.get("round")
            and m.get("cursor") == tip.get("cursor_end"))
    return Verdict("frontier_is_tip", same,
                   f"frontier {fr[0][:12]} round {m.get('round')} cursor {m.get('cursor')} params "
                   f"{str(m.get('params_hash'))[:12]}; last commit {tip.get('commit_id')} round {tip.get('round')} "
                   f"cursor {tip.get('cursor_end')} params {str(tip.get('param_hash'))[:12]}")


def faults_logged(run_dir: Path, summary: dict[str, Any], scenario: Any) -> Verdict:
    chaos = summary.get("chaos")
    if not chaos:
        return Verdict("faults_logged", False, "summary.json has no chaos outcome (was the scenario run?)")
    injected = {e.get("fault"): e for e in _logs(run_dir, "chaos") if e.get("event") == "fault_injected"}
    bad = []
    for i in chaos["fired"]:
        f = scenario.faults[i]
        e = injected.get(i)
        if e is None:
            bad.append(f"faults[{i}] {f.kind} {f.target}: fired, but no fault_injected in chaos.jsonl")
        elif (e.get("kind"), e.get("target")) != (f.kind, f.target):
            bad.append(f"faults[{i}]: chaos.jsonl says {e.get('kind')} {e.get('target')}, the schedule {f.kind} "
                       f"{f.target}")
    for f in chaos["never_fired"]:
        if f["trigger"].keys() & {"at_step", "at_useful_tokens"}:
            bad.append(f"faults[{f['index']}] {f['kind']} {f['target']}: progress trigger {f['trigger']} never fired")
    bad += [f"faults[{f['index']}] {f['kind']} {f['target']}: the injection failed" for f in chaos["failed"]]
    bad += [f"faults[{f['index']}] {f['kind']} {f['target']}: never healed (every heal failed)"
            for f in chaos["faults"] if f["status"] == "heal_failed"]
    late = sorted({e.get("fault") for e in _logs(run_dir, "chaos")
                   if e.get("event") == "fault_failed" and e.get("phase") == "heal"}, key=str)
    extra = sorted(set(injected) - set(chaos["fired"]), key=str)
    if extra:
        bad.append(f"chaos.jsonl has injections {extra} the driver does not count as fired")
    ok = (f"{len(chaos['fired'])} fired, all in chaos.jsonl; {len(chaos['never_fired'])} wall-time fault(s) came "
          f"after the run" + (f"; healed only on a retry: faults {late}" if late else ""))
    return Verdict("faults_logged", not bad, "; ".join(bad) or ok)


def judge_run(run_dir: Path, summary: dict[str, Any], scenario: Any, target_tokens: int) -> RunJudgement:
    if not summary:
        return RunJudgement((Verdict("summary", False, "the run wrote no summary"),))
    checks_v, statuses = analysis_checks(run_dir)
    verdicts = (reached_target(summary, target_tokens), checks_v, clean_exit(summary), checkpoints(run_dir),
                frontier_is_tip(run_dir), faults_logged(run_dir, summary, scenario))
    return RunJudgement(verdicts, statuses)


def same_frontier(run_dirs: list[Path], out: Path) -> Verdict:
    """The analysis's same_frontier checker over the runs of one schedule (all policies)."""
    from analysis.analyze import analyze

    if len(run_dirs) < 2:
        return Verdict("same_frontier", True, "one run: not judged")
    try:
        art = analyze(run_dirs, out, report=False).artifact
    except Exception as e:
        return Verdict("same_frontier", False, f"xdc analyze raised {type(e).__name__}: {e}")
    c = next((c for c in art["checks"] if c["name"] == "same_frontier"), None)
    if c is None:
        return Verdict("same_frontier", False, "the analysis has no same_frontier checker")
    return Verdict("same_frontier", c["status"] == "pass", f"{c['status']}: {c['summary']}")


# ------------------------------------------------------------------------------- recoveries


def _recovery_kind(proc: str, e: dict[str, Any]) -> str | None:
    name = e.get("event")
    if proc == "coord":
        if name == "site_failed":
            return "site_failed"
        if name == "membership_epoch" and e.get("restore") not in (None, "none"):
            return f"epoch_restore_{e.get('restore')}"
        if name == "membership_epoch" and e.get("joiners"):
            return "epoch_rejoin"
        if name == "coordinator_recovered":
            return "coordinator_recovered"
        if name == "commit_refused":
            return "commit_refused"
        return None
    return name if name in ("peer_unreachable", "collective_aborted", "checkpoint_failed", "restore_failed",
                            "preemption_announced", "state_received") else None


def _windows(run_dir: Path, grace_ns: int) -> dict[int, tuple[int, int]]:
    """Per fault index: [injection, last heal + grace] in monotonic ns (no heal: open-ended)."""
    out: dict[int, list[int]] = {}
    for e in _logs(run_dir, "chaos"):
        i, t = e.get("fault"), e.get("mono_ns", 0)
        if e.get("event") == "fault_injected":
            out[i] = [t, 2 ** 63]
        elif e.get("event") == "fault_healed" and i in out:
            out[i][1] = t + grace_ns
    return {i: (a, b) for i, (a, b) in out.items()}


def recoveries(run_dir: Path, sites: list[str], grace_s: float) -> tuple[dict[str, int], dict[int, list[str]]]:
    """(count per recovery kind, recovery kinds per fault index). A recovery belongs to every fault
    in force when it happened (from its injection to `grace_s` after its heal: detection, restart
    and rejoin take that long); one outside every such window counts as `unattributed:<kind>` (a
    detector acting with no fault to act on, i.e. a false suspicion, shows up there)."""
    win = _windows(run_dir, int(grace_s * 1e9))
    first = min((a for a, _b in win.values()), default=None)
    counts: dict[str, int] = {}
    per_fault: dict[int, list[str]] = {i: [] for i in win}
    for proc in ("coord", *sites):
        for e in _logs(run_dir, proc):
            kind = _recovery_kind(proc, e)
            t = e.get("mono_ns", 0)
            if kind is None or first is None or t < first:
                continue  # before any fault: the cluster forming, not a recovery
            causes = [i for i, (a, b) in win.items() if a <= t <= b]
            key = kind if causes else f"unattributed:{kind}"
            counts[key] = counts.get(key, 0) + 1
            for i in causes:
                per_fault[i].append(kind if proc == "coord" else f"{proc}:{kind}")
    return counts, per_fault
