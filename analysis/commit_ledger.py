"""The optimizer-commit ledger: one row per commit the coordinator recorded, from the logs alone.

Per commit: wall time and logical tick (round, step), the consistency setting it was trained in
and how that setting came about (fixed, scripted, adaptive) with the controller's decision after
that cycle (change / keep / abstain and why), the stress on the cluster when it committed (the
faults active then) and its membership, its lineage (parent; whether it is in the final model's
lineage), update age (inner steps since the members last agreed: the setting's H), the sites'
disagreement (cosine of each contribution to the cluster mean; max/min norm ratio), useful /
attempted / replayed work, WAN payload and time of its collective, and the held-out NLL where that
round was evaluated. Every number is `measured` (read from the logs); a missing one is None.
"""

from __future__ import annotations

from typing import Any, Iterable

EVIDENCE = "measured"


def _lineage_ids(commits: list[dict[str, Any]]) -> set[str]:
    by_id = {c["commit_id"]: c for c in commits}
    out: set[str] = set()
    tip = commits[-1] if commits else None
    while tip is not None and tip["commit_id"] not in out:
        out.add(tip["commit_id"])
        tip = by_id.get(tip.get("parent")) if tip.get("parent") else None
    return out


def _active_faults(chaos: list[dict[str, Any]], wall_ns: int) -> list[str]:
    """Faults injected before wall_ns and not healed by then, as 'kind target'."""
    active: dict[int, str] = {}
    for e in chaos:
        if e.get("wall_ns", 0) > wall_ns:
            break
        if e.get("event") == "fault_injected" and not e.get("noop"):
            active[int(e.get("fault", -1))] = f"{e.get('kind')} {e.get('target')}"
        elif e.get("event") == "fault_healed":
            active.pop(int(e.get("fault", -1)), None)
    return sorted(active.values())


def commit_ledger(coord: list[dict[str, Any]], chaos: list[dict[str, Any]],
                  site_evals: Iterable[dict[str, Any]], config: dict[str, Any]) -> list[dict[str, Any]]:
    seq = int(config["model"]["seq_len"])
    mode = str(config.get("train", {}).get("mode", "local"))
    commits = [e for e in coord if e.get("event") == "commit"]
    obs = {(e["epoch"], e["round"]): e for e in coord if e.get("event") == "cycle_observed"}
    decisions = {(e.get("commit_epoch"), e["round"]): e for e in coord if e.get("event") == "controller_decision"}
    nll = {int(e["useful_tokens_trained"]): e.get("heldout_nll") for e in site_evals
           if e.get("event") == "eval" and e.get("useful_tokens_trained") is not None}
    lineage = _lineage_ids(commits)
    rows: list[dict[str, Any]] = []
    prev_members: list[str] | None = None
    reached = 0  # the furthest sample cursor any earlier commit reached: work below it is replayed
    for c in commits:
        setting = c.get("setting") or {"mode": mode if mode in ("sync", "local") else "local",
                                       "inner_steps_h": config.get("train", {}).get("inner_steps_h"),
                                       "compression": config.get("train", {}).get("compression", "none")}
        h = 1 if setting["mode"] == "sync" else setting["inner_steps_h"]
        o = obs.get((c["epoch"], c["round"]), {})
        d = decisions.get((c["epoch"], c["round"]))
        cs, ce = int(c["cursor_start"]), int(c["cursor_end"])
        rows.append({
            "commit_id": c["commit_id"], "parent": c.get("parent"), "in_lineage": c["commit_id"] in lineage,
            "wall_ns": c.get("wall_ns"), "epoch": c["epoch"], "round": c["round"], "step": c.get("step"),
            "mode": setting["mode"], "inner_steps_h": h, "compression": setting["compression"],
            "setting_source": mode if mode in ("scripted", "adaptive") else "fixed",
            "action": d["action"] if d else None, "action_reason": d["reason"] if d else None,
            "abstained": bool(d and d["action"] == "abstain"),
            "members": list(c["members"]), "membership_changed": prev_members is not None
            and prev_members != list(c["members"]), "stress": _active_faults(chaos, int(c.get("wall_ns", 0))),
            "update_age_steps": h, "cos_to_mean": o.get("cos_to_mean"), "norm_ratio": o.get("norm_ratio"),
            "useful_tokens": ce * seq, "attempted_tokens": int(sum(c.get("tokens", {}).values())),
            "replayed_tokens": max(0, min(ce, reached) - cs) * seq,
            "wan_payload_bytes": o.get("payload_bytes"), "wan_time_s": o.get("t_comm_s"),
            "goodput_bps": o.get("goodput_bps"), "heldout_nll": nll.get(ce * seq),
            "evidence": EVIDENCE})
        prev_members = list(c["members"])
        reached = max(reached, ce)
    return rows
