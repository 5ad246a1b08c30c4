"""The no_fresh_overwrite checker (see analysis/checkers.py): a freshly started process never became
a source of truth (donor, commit member, checkpoint writer) before it had loaded the cluster's state
(a donor's, the store's, or the initial weights in a verified genesis restart)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from analysis.check_result import CheckResult, _result
from analysis.load import RunHistory
from analysis.proofs import (COORD, INITIAL, Announcement, announcements, expected_sites, initial_hashes, label,
                             missing_logs, verify_genesis)

_label = label


def _genesis_loads(h: RunHistory, ann: dict[int, Announcement], missing: list[str]) -> dict[str, tuple[str, str]]:
    """restore event id -> (verdict, why) for every restore from the initial weights: "ok" only in a
    verified genesis epoch (the plan restores everyone from the initial weights and every member did),
    "unknown" when a member's log needed to verify it is missing, else "bad"."""
    out: dict[str, tuple[str, str]] = {}
    checks: dict[int, Any] = {}
    for site in expected_sites(h):
        starts = initial_hashes(h, site)
        for e in h.events(site, "restore"):
            if e.get("source") != INITIAL or "error" in e:
                continue
            a = ann.get(int(e.get("epoch", -1)))
            if a is None:
                out[e["id"]] = ("bad", f"epoch {e.get('epoch')} was never announced")
                continue
            chk = checks.setdefault(a.epoch, verify_genesis(h, a))
            missing += list(chk.missing)
            if site not in a.members or e.get("params_hash") != starts.get(int(e.get("pid", 0))):
                out[e["id"]] = ("bad", f"not a member of epoch {a.epoch}, or not its initial params hash")
            elif chk.problems or not a.is_genesis:
                out[e["id"]] = ("bad", "; ".join(chk.problems))
            else:
                out[e["id"]] = ("ok" if chk.verified else "unknown", "a verified genesis restart")
    return out


def _fresh_violations(h: RunHistory, site: str, pevs: list[dict[str, Any]],
                      genesis: dict[str, tuple[str, str]]) -> list[str]:
    lab = _label(h)
    pid = int(pevs[0].get("pid", 0))
    out, loaded = [], False
    for e in pevs:
        ev = e["event"]
        if ev == "restore" and e.get("source") in ("donor", "store") and "error" not in e:
            loaded = True
        elif ev == "restore" and e["id"] in genesis:
            verdict, why = genesis[e["id"]]
            loaded = loaded or verdict != "bad"  # "unknown": the checker says unknown (its evidence is missing)
            if verdict == "bad":
                out.append(f"{lab} {e['id']}: {site} (pid {pid}) restored the initial weights, which is not the "
                           f"cluster's state here: {why}")
        elif ev == "state_received":
            loaded = True
        if not loaded and ev in ("state_sent", "checkpoint_write", "round_done", "collective", "work_attempted"):
            out.append(f"{lab} {e['id']}: {site} (pid {pid}, started after the first commit) logged "
                       f"{ev} before loading the cluster's state")
    return out


def check_no_fresh_overwrite(runs: list[RunHistory], ctx: dict[str, Any]) -> CheckResult:
    viol, notes, missing = [], [], []
    for h in runs:
        lab = _label(h)
        missing += missing_logs(h, [COORD, *expected_sites(h)])
        ann = announcements(h)
        commits = h.events(COORD, "commit")
        committed_hashes = {c.get("param_hash") for c in commits}
        first_commit_ns = int(commits[0]["wall_ns"]) if commits else None
        genesis = _genesis_loads(h, ann, missing)
        fresh = 0
        for site in expected_sites(h):
            by_pid: dict[int, list[dict[str, Any]]] = defaultdict(list)
            for e in h.logs.get(site, []):
                by_pid[int(e.get("pid", 0))].append(e)
            initial = set(initial_hashes(h, site).values())
            for pevs in by_pid.values():
                start = next((e for e in pevs if e["event"] == "site_started"), pevs[0])
                if first_commit_ns is None or int(start["wall_ns"]) < first_commit_ns:
                    continue  # started with the cluster: its initial weights are the cluster's state
                fresh += 1
                viol += _fresh_violations(h, site, pevs, genesis)
            for e in h.events(site, "state_sent"):
                if not committed_hashes or e.get("params_hash") in committed_hashes:
                    continue
                a = ann.get(int(e.get("epoch", -1)))
                if e.get("params_hash") in initial and a is not None and a.start_round == 0:
                    continue  # the epoch resumes from round 0, whose state is the initial weights
                viol.append(f"{lab} {e['id']}: {site} sent state {str(e.get('params_hash'))[:12]} that no commit "
                            "produced" + (" (the initial weights)" if e.get("params_hash") in initial else ""))
        n_gen = sum(1 for verdict, _ in genesis.values() if verdict == "ok")
        notes.append(f"{lab}: {fresh} freshly started site process(es); each loaded state before acting"
                     + (f" ({n_gen} restore(s) from the initial weights in verified genesis restarts)" if n_gen else ""))
    return _result("no_fresh_overwrite", viol, "no fresh member ever became a source of truth",
                   "{n} actions by a member that had not loaded the cluster's state", notes, missing)
