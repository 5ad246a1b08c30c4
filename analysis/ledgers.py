"""The ledgers of one run from its structured logs: work, bytes, checkpoints, time per site.

Pure functions over events already read (analysis/load.py); analysis/run_numbers.py derives a run's
numbers from them once, for summary.json and the artifact alike.

Work ledger: every `work_attempted` (site, epoch, round, samples, tokens, FLOPs) is
retained if a `commit` of that epoch and round, in the lineage of the last commit, names
the site; otherwise it is lost. attempted = retained + lost holds by construction, per site
and in total, and the summary checks it.

Byte ledger: each process logs cumulative `wan_counters`; the last snapshot of each is
summed over everything it sent (side "tx"), so every byte is counted once, by its sender.
Collective bytes of rounds that never committed are moved to `aborted_collective`.
The sum is reconciled with Toxiproxy's own per-proxy counters; the difference is the
ZMTP/CURVE handshake and ZMTP heartbeat traffic that no class owns (framing overhead).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from wan.frames import TRAFFIC_CLASSES
from ground.processes import has_byte_counters


def lineage(commits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chain of commits from the last one back to the root, oldest first."""
    if not commits:
        return []
    by_id = {c["commit_id"]: c for c in commits}
    chain = []
    cur: dict[str, Any] | None = commits[-1]
    seen = set()
    while cur is not None and cur["commit_id"] not in seen:
        seen.add(cur["commit_id"])
        chain.append(cur)
        cur = by_id.get(cur.get("parent")) if cur.get("parent") else None
    return list(reversed(chain))


def credited_attempts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A site's `work_attempted` events, each under the epoch whose round used it last.

    A survivor that takes a failed member's round over keeps the inner steps it already took in
    it (site_agent/carry.py) and logs each as `work_carried` {from_epoch, round, inner_step} in the
    new epoch: that attempt then counts under the new epoch, whose commit retains it (or not). No
    attempt is added or removed, so attempted = retained + lost still holds. `events` is the site's
    log in file order (its `work_attempted` and `work_carried` events at least)."""
    out: list[dict[str, Any]] = []
    where: dict[tuple[Any, ...], int] = {}  # (pid, epoch, round, inner step) -> index in out
    for e in events:
        kind = e["event"]
        if kind == "work_attempted":
            where[(e.get("pid", 0), e["epoch"], e["round"], e["inner_step"])] = len(out)
            out.append(e)
        elif kind == "work_carried":
            i = where.get((e.get("pid", 0), e["from_epoch"], e["round"], e["inner_step"]))
            if i is not None:
                out[i] = {**out[i], "epoch": e["epoch"]}
                where[(e.get("pid", 0), e["epoch"], e["round"], e["inner_step"])] = i
    return out


def work_ledger(logs: dict[str, list[dict[str, Any]]], sites: list[str], seq_len: int) -> dict[str, Any]:
    """The work ledger. Also returns `first_replays`: per (site, pid, epoch) the first attempt that
    redid samples an earlier attempt had lost (the timeline's replay marks)."""
    commits = [e for e in logs.get("coord", []) if e["event"] == "commit"]
    kept = {(c["epoch"], c["round"]): frozenset(c.get("members", ())) for c in lineage(commits)}
    per_site: dict[str, dict[str, float]] = {}
    retained_ids: set[int] = set()
    lost_units: list[dict[str, Any]] = []
    attempts: list[tuple[int, str, bool, dict[str, Any]]] = []  # (mono ns, site, retained, event)
    for s in sites:
        at_tok = re_tok = lo_tok = 0
        at_fl = re_fl = lo_fl = 0.0
        for e in logs.get(s, []):
            if e["event"] != "work_attempted":
                continue
            tokens, flops = e["tokens"], e["flops"]
            at_tok += tokens
            at_fl += flops
            members = kept.get((e["epoch"], e["round"]))
            retained = members is not None and s in members
            if retained:
                re_tok += tokens
                re_fl += flops
                retained_ids.update(e["samples"])
            else:
                lo_tok += tokens
                lo_fl += flops
                lost_units.append({"site": s, "epoch": e["epoch"], "round": e["round"], "tokens": tokens})
            attempts.append((e["mono_ns"], s, retained, e))
        per_site[s] = {"attempted_tokens": int(at_tok), "retained_tokens": int(re_tok), "lost_tokens": int(lo_tok),
                       "attempted_flops": float(at_fl), "retained_flops": float(re_fl), "lost_flops": float(lo_fl)}
    # Replayed work: lost samples that were attempted again later (by any site).
    lost_before: set[int] = set()
    replayed_ids: set[int] = set()
    first_replays: list[tuple[str, dict[str, Any]]] = []
    seen: set[tuple[str, int, int]] = set()
    attempts.sort(key=lambda t: t[0])
    for _t, s, retained, e in attempts:
        samples = e["samples"]
        if lost_before and not lost_before.isdisjoint(samples):
            replayed_ids.update(lost_before.intersection(samples))
            key = (s, e.get("pid", 0), e["epoch"])
            if key not in seen:
                seen.add(key)
                first_replays.append((s, e))
        if not retained:
            lost_before.update(samples)
    total = {k: sum(v[k] for v in per_site.values()) for k in next(iter(per_site.values()), {})}
    total["replayed_tokens"] = len(replayed_ids) * seq_len
    balanced = all(v["attempted_tokens"] == v["retained_tokens"] + v["lost_tokens"] for v in per_site.values())
    return {"per_site": per_site, "total": total, "balanced": balanced, "lost_units": lost_units,
            "replayed_samples": len(replayed_ids), "first_replays": first_replays,
            "useful_tokens": len(retained_ids) * seq_len, "useful_samples": len(retained_ids),
            "commits": len(commits), "lineage_length": len(kept)}


def _sender(link: str, direction: str) -> str:
    """The process that sends on `link` in `direction`: links are `<client>_to_<server>`, "up" is
    client to server (Toxiproxy's upstream), "down" is server to client."""
    client, _, server = link.partition("_to_")
    return client if direction == "up" else server


def byte_ledger(logs: dict[str, list[dict[str, Any]]], committed_rounds: set[tuple[int, int]],
                pids: dict[str, set[int]] | None = None) -> dict[str, Any]:
    """Bytes per class and link, each counted once, by its sender.

    Counters are cumulative per process incarnation (pid) and logged every round and once more,
    `final`, after the endpoint closed. An incarnation that was killed never logs its final
    counters, so what it sent after its last snapshot is missing from its own count; those bytes
    did reach the receivers, whose `rx` counters hold them. So for every (link, direction, class)
    whose sender has an incarnation without final counters, the count is the larger of what the
    senders logged and what the receivers logged (never their sum: no byte is counted twice).
    `rx_filled` says where and by how much that raised a count. `in_doubt` is, per link, the bytes
    a sender handed to a connection shortly before it closed (its `doubt` rows): counted as sent,
    though they may never have reached the proxy.

    `logs` may hold only each process's `wan_counters` and `collective` events when `pids` gives
    every incarnation (pid) of each process, from all its events.
    """
    by_class = {c: 0 for c in TRAFFIC_CLASSES}
    by_link: dict[str, int] = defaultdict(int)
    by_link_class: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    tx: dict[tuple[str, str, str], int] = defaultdict(int)
    rx: dict[tuple[str, str, str], int] = defaultdict(int)
    in_doubt: dict[str, int] = defaultdict(int)
    missing, incomplete = [], set()
    for proc, events in logs.items():
        snaps = [e for e in events if e["event"] == "wan_counters"]
        if not snaps:
            if has_byte_counters(proc):  # a process with WAN links (ground/processes.py) that logged none
                missing.append(proc)
            continue
        # A restarted process starts from zero: take the last snapshot of every incarnation and add them.
        last_by_pid: dict[int, dict[str, Any]] = {}
        for e in snaps:
            last_by_pid[e.get("pid", 0)] = e
        incarnations = pids[proc] if pids is not None and proc in pids else {e.get("pid", 0) for e in events}
        if any(not last_by_pid.get(pid, {}).get("final") for pid in incarnations):
            incomplete.add(proc)  # an incarnation ended without its final counters (killed)
        for e in last_by_pid.values():
            for row in e["counters"]:
                key = (row["link"], row["direction"], row["cls"])
                if row["side"] == "tx":
                    tx[key] += row["bytes"]
                elif row["side"] == "rx":
                    rx[key] += row["bytes"]
                elif row["side"] == "doubt":
                    in_doubt[row["link"]] += row["bytes"]
    rx_filled: dict[str, int] = defaultdict(int)
    for key in sorted(set(tx) | set(rx)):
        link, direction, cls = key
        n = tx.get(key, 0)
        if _sender(link, direction) in incomplete and rx.get(key, 0) > n:
            rx_filled[link] += rx[key] - n
            n = rx[key]
        if cls not in by_class:
            by_class[cls] = 0  # an unknown class stays visible (the byte_classes checker fails on it)
        by_class[cls] += n
        by_link[link] += n
        by_link_class[link][cls] += n
    # Collective payload of rounds that did not commit -> aborted_collective (payload share of wire bytes).
    aborted_payload = 0
    coll_payload = 0
    for proc, events in logs.items():
        for e in events:
            if e["event"] == "collective" and "payload_bytes_sent" in e:
                coll_payload += e["payload_bytes_sent"]
                if (e["epoch"], e["round"]) not in committed_rounds:
                    aborted_payload += e["payload_bytes_sent"]
    if aborted_payload and coll_payload:
        moved = round(by_class["collective"] * aborted_payload / coll_payload)
        by_class["collective"] -= moved
        by_class["aborted_collective"] += moved
    return {"by_class": by_class, "by_link": dict(by_link),
            "by_link_class": {k: dict(v) for k, v in by_link_class.items()}, "processes_without_counters": missing,
            "rx_filled": dict(rx_filled), "killed_senders": sorted(incomplete), "in_doubt": dict(in_doubt)}


def reconcile(counted_by_link: dict[str, int], proxy_bytes: dict[str, Any]) -> dict[str, Any]:
    """Compare counted bytes with Toxiproxy's per-proxy totals (both directions)."""
    if not proxy_bytes or "error" in proxy_bytes:
        return {"evidence": "unavailable", "reason": str(proxy_bytes.get("error", "no proxy counters"))}
    proxy_total = sum(v.get("upstream", 0) + v.get("downstream", 0) for v in proxy_bytes.values())
    counted_total = sum(counted_by_link.values())
    per_link = {}
    for link, v in sorted(proxy_bytes.items()):
        p = v.get("upstream", 0) + v.get("downstream", 0)
        c = counted_by_link.get(link, 0)
        per_link[link] = {"proxy": p, "counted": c, "overhead": p - c}
    overhead = proxy_total - counted_total
    return {"evidence": "measured", "proxy_total": proxy_total, "counted_total": counted_total,
            "overhead_bytes": overhead, "overhead_fraction": overhead / proxy_total if proxy_total else 0.0,
            "per_link": per_link}


def checkpoint_tree(logs: dict[str, list[dict[str, Any]]], frontier_hash: str | None) -> list[dict[str, Any]]:
    """Every durable checkpoint with its parent; abandoned branches are kept and marked."""
    nodes = [e for e in logs.get("store", []) if e["event"] == "checkpoint_durable"]
    by_hash = {e["manifest_hash"]: e for e in nodes}
    in_lineage: set[str] = set()
    cur = frontier_hash
    while cur and cur not in in_lineage:
        in_lineage.add(cur)
        cur = by_hash.get(cur, {}).get("parent")
    return [{"manifest_hash": e["manifest_hash"], "parent": e.get("parent"), "round": e.get("round"),
             "ckpt_id": e.get("ckpt_id"), "in_final_lineage": e["manifest_hash"] in in_lineage} for e in nodes]


def site_time(logs: dict[str, list[dict[str, Any]]], sites: list[str]) -> dict[str, dict[str, float]]:
    """Per site: seconds busy (compute, collective, restore, checkpoint, eval spans) and idle in between."""
    out = {}
    for s in sites:
        evs = logs.get(s, [])
        member = [e["mono_ns"] for e in evs if e["event"] == "membership"]
        end = [e["mono_ns"] for e in evs if e["event"] in ("target_reached", "site_stopped")]
        if not member or not end:
            continue
        busy = sum(e["end_mono_ns"] - e["start_mono_ns"] for e in evs
                   if e["event"] in ("compute", "collective", "restore", "checkpoint_write", "eval")
                   and "start_mono_ns" in e)
        wall = max(end) - min(member)
        out[s] = {"wall_s": wall / 1e9, "busy_s": busy / 1e9, "idle_s": max(0, wall - busy) / 1e9}
    return out
