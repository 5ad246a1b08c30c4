"""Running a registered study: one real run (cluster/launcher.py: site processes, coordinator, store,
Toxiproxy) per (stratum, arm), strata in protocol order and the arms of a stratum back to back so
the pair shares the machine's conditions, then the no-failure controls.

Resumable through the ledger (studies/ledger.py): a finished run is never run again, an
interrupted one runs again in a new directory, and when the code revision differs from the one the
finished runs were made with, `run_study` says so (and the artifact marks the study as mixing
revisions; the `mixed_code_revisions` invalidator fires if the protocol lists it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from studies.ledger import Ledger, file_sha256, logs_sha256
from studies.metrics import run_metrics, run_record
from studies.protocol import arm_configs, run_config_dict
from studies.protocol_model import Protocol, Stratum


def run_keys(p: Protocol) -> list[tuple[str, Stratum, str, bool]]:
    """(key, stratum, arm, with_faults) of every run of the study, in order. A no-failure control
    is a separate run only where the stratum has faults (otherwise its main run is the control)."""
    out = [(f"{s.name}/{a.name}", s, a.name, True) for s in p.strata for a in p.arms]
    c = p.controls or {}
    for s in p.strata:
        if s.name in c.get("strata", []) and s.faults and s.faults.get("faults"):
            out += [(f"control/{s.name}/{a}", s, a, False) for a in c["arms"]]
    return out


def control_key(p: Protocol, s: Stratum, arm: str) -> str:
    return f"control/{s.name}/{arm}" if s.faults and s.faults.get("faults") else f"{s.name}/{arm}"


def _scenario(s: Stratum) -> Any:
    from chaos.scenario import Scenario

    if not s.faults or not s.faults.get("faults"):
        return None
    return Scenario.from_dict(s.faults, source=f"stratum {s.name}")


def run_study(p: Protocol, entry: dict[str, Any], out: Path, *, timeout_s: float = 1800, quiet: bool = True,
              max_runs: int | None = None, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run what the ledger has not finished. Returns {"done", "ran", "skipped", "stopped", "notes"}."""
    from chaos.policy_config import config_for_policy
    from chaos.reach import check_scenario_fits
    from ground.config import load_config, merge
    from cluster.launcher import launch
    from ground.provenance import code_revision

    arm_configs(p)  # refuses an arm the config loader does not accept, before any run
    for key, s, arm_name, with_faults in run_keys(p):  # and a fault that could never fire, before any run
        sc = _scenario(s) if with_faults else None
        if sc is not None:
            check_scenario_fits(load_config(run_config_dict(p, s, p.arm(arm_name))), sc)
    out.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(out / "ledger.jsonl")
    seen = ledger.protocols()
    if seen and any(h != entry["sha256"] for h, _ in seen):
        raise ValueError(f"{out} holds runs of another version of study {p.name!r} (sha256 "
                         f"{seen[0][0][:16]}…); use a new directory for version {entry['version']}")
    rev = code_revision()
    notes: list[str] = []
    finished = ledger.finished()
    old_revs = {json.dumps(r.get("code_revision"), sort_keys=True) for r in finished.values()}
    if finished and old_revs != {json.dumps(rev, sort_keys=True)}:
        msg = (f"note: {len(finished)} finished run(s) were made at code revision(s) "
               f"{sorted({(r.get('code_revision') or {}).get('commit', '?')[:12] for r in finished.values()})}, "
               f"this invocation is at {str(rev.get('commit'))[:12]}{' (dirty)' if rev.get('dirty') else ''}: the "
               "study mixes code revisions")
        say(msg)
        notes.append(msg)
    ledger.append({"type": "study_started", "name": p.name, "version": entry["version"], "sha256": entry["sha256"],
                   "code_revision": rev})
    for key, dirs in ledger.interrupted().items():
        say(f"note: run {key} was interrupted before it finished ({', '.join(dirs)}); it runs again")
    ran: list[str] = []
    skipped: list[str] = []
    stopped: str | None = None
    keys = run_keys(p)
    from studies.start_state import START_KEY, resolved, start_overrides

    start = resolved(p, finished)
    if start is not None:  # a start state named by hash (or made earlier) must be there, whole, before any run
        from site_agent.init_state import check_init_config

        check_init_config(start["store_dir"], start["manifest_sha256"])
    if p.start_state and start is None:  # the shared trained state: made once, first, without faults
        if max_runs is not None and max_runs < 1:
            return {"done": False, "ran": [], "skipped": [], "stopped": "stopped before the start-state run", "notes": notes}
        say(f"study {p.name}: the start state: one run of {p.start_state['target_useful_tokens']:,} useful tokens")
        why = _run_start_state(p, ledger, out, rev, timeout_s=timeout_s, quiet=quiet)
        if why:
            return {"done": False, "ran": [], "skipped": [], "stopped": why, "notes": notes}
        ran.append(START_KEY)
        start = resolved(p, ledger.finished())
    for key, s, arm_name, with_faults in keys:
        if key in finished:
            skipped.append(key)
            continue
        if max_runs is not None and len([k for k in ran if k != START_KEY]) >= max_runs:
            stopped = f"stopped after {max_runs} run(s) (--max-runs)"
            break
        arm = p.arm(arm_name)
        scenario = _scenario(s) if with_faults else None
        attempt = len(ledger.interrupted().get(key, [])) + 1
        run_id = key.replace("/", "--") + (f"-try{attempt}" if attempt > 1 else "")
        cfg = load_config(merge(run_config_dict(p, s, arm), {**start_overrides(start), "runs_dir": str(out / "runs"),
                                                             "run_id": run_id}))
        if scenario is not None:
            check_scenario_fits(cfg, scenario)
        cfg = config_for_policy(cfg, arm.policy, scenario)
        run_dir = out / "runs" / run_id
        ledger.append({"type": "run_started", "key": key, "run_dir": str(run_dir), "code_revision": rev})
        n_done = len([k for k in (*finished, *ran) if k != START_KEY])
        say(f"study {p.name}: run {n_done + 1}/{len(keys)}: {key}"
            f"{' (no-failure control)' if not with_faults else ''}")
        run_dir_, summary = launch(cfg, quiet=quiet, scenario=scenario, timeout_s=timeout_s)
        if not summary or summary.get("interrupted"):
            ledger.append({"type": "run_stopped", "key": key, "run_dir": str(run_dir_),
                           "why": "interrupted" if summary else "the run failed before it started"})
            stopped = f"run {key} {'was interrupted' if summary else 'failed before it started'}"
            break
        rd = Path(run_dir_)
        ledger.append({"type": "run_finished", "key": key, "stratum": s.name, "arm": arm_name,
                       "control": not with_faults, "run_dir": str(rd.resolve()), "code_revision": rev,
                       "hashes": {"config_sha256": file_sha256(rd / "config.json"),
                                  "summary_sha256": file_sha256(rd / "summary.json"),
                                  "logs_sha256": logs_sha256(rd)},
                       "metrics": run_metrics(rd, summary), "record": run_record(rd, summary)})
        ran.append(key)
    done = stopped is None and all(k in ledger.finished() for k, *_ in keys)
    return {"done": done, "ran": ran, "skipped": skipped, "stopped": stopped, "notes": notes}


def _run_start_state(p: Protocol, ledger: Ledger, out: Path, rev: dict[str, Any], *, timeout_s: float,
                     quiet: bool) -> str | None:
    """Train the study's start state (studies/start_state.py); None on success, else why it stopped."""
    from ground.config import load_config, merge
    from studies.start_state import START_KEY, frontier_of, start_config_dict
    from cluster.launcher import launch

    attempt = len(ledger.interrupted().get(START_KEY, [])) + 1
    run_id = "start-state" + (f"-try{attempt}" if attempt > 1 else "")
    cfg = load_config(merge(start_config_dict(p), {"runs_dir": str(out / "runs"), "run_id": run_id}))
    ledger.append({"type": "run_started", "key": START_KEY, "run_dir": str(out / "runs" / run_id), "code_revision": rev})
    run_dir_, summary = launch(cfg, quiet=quiet, scenario=None, timeout_s=timeout_s)
    if not summary or summary.get("interrupted") or not summary.get("clean_exit"):
        ledger.append({"type": "run_stopped", "key": START_KEY, "run_dir": str(run_dir_),
                       "why": "interrupted" if summary else "the run failed before it started"})
        return f"the start-state run {'was interrupted or did not exit cleanly' if summary else 'failed to start'}"
    rd = Path(run_dir_)
    st = frontier_of(rd)
    ledger.append({"type": "run_finished", "key": START_KEY, "stratum": "", "arm": "", "control": False,
                   "run_dir": str(rd.resolve()), "code_revision": rev, "start_state": st,
                   "hashes": {"config_sha256": file_sha256(rd / "config.json"),
                              "summary_sha256": file_sha256(rd / "summary.json"), "logs_sha256": logs_sha256(rd)},
                   "summary": {k: summary.get(k) for k in ("useful_tokens", "attempted_tokens", "final_heldout_nll",
                                                           "frontier_hash")}})
    return None


def check_controls(p: Protocol, finished: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per control stratum: do the no-failure runs of the control arms match exactly (state hash,
    useful and attempted work, final NLL)? `expect: identical` makes a mismatch a failed check."""
    c = p.controls
    if not c:
        return []
    out = []
    for sname in c["strata"]:
        s = next(x for x in p.strata if x.name == sname)
        fin = {a: finished.get(control_key(p, s, a), {}) for a in c["arms"]}
        recs = {a: f.get("record") for a, f in fin.items()}
        # a run without faults whose membership changed saw a failure nobody injected (e.g. a site
        # that missed its heartbeats on a loaded machine): name it, it explains a mismatch
        unplanned = {a: ((f.get("metrics") or {}).get("opportunity_ticks") or {}).get("membership_changes", 0)
                     for a, f in fin.items()}
        if any(r is None for r in recs.values()):
            out.append({"stratum": sname, "status": "unknown", "reason": "not every control run finished",
                        "runs": {}})
            continue
        fields = ("state_hash", "useful_tokens", "attempted_tokens", "final_heldout_nll")
        vals = {f: {a: r[f] for a, r in recs.items()} for f in fields}
        same = {f: len({json.dumps(v) for v in vals[f].values()}) == 1 for f in fields}
        ok = all(same.values())
        status = "pass" if ok else ("fail" if c["expect"] == "identical" else "differs")
        why = "" if ok else f"differ in {', '.join(f for f, v in same.items() if not v)}"
        extra = [f"{a} had {n} membership change(s) without an injected fault" for a, n in unplanned.items() if n]
        if extra:
            why += ("; " if why else "") + "; ".join(extra)
        out.append({"stratum": sname, "status": status, "expect": c["expect"], "matched": same, "values": vals,
                    "unplanned_membership_changes": unplanned,
                    "reason": why if why else "state, work and final NLL matched exactly"})
    return out
