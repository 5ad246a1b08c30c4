"""Checkers over the history, in the spirit of Jepsen: each returns pass / fail / unknown with evidence.

A checker is a pure function of the loaded runs (and their ledgers). `run_checkers` calls every
one; a checker that raises yields "unknown" with the error, never a dead report. Each checker
checks something the logs of *different* processes must agree on, so a bug in one process's
bookkeeping shows up as a disagreement rather than being trusted:

  log_integrity       every line parses (a torn last line is allowed), its envelope (ground/events.py
                      STAMPED, span bounds) has the right types, and event ids are unique
  fencing             no process applied anything from an older epoch; commits, rounds and
                      durable checkpoints happen only in announced epochs, by their members; a site
                      acts only in epochs the coordinator announced
  work_ledger         attempted = retained + lost per site and in total; no canonical sample is
                      retained twice; the coordinator's commit record agrees with the sites' logs;
                      the durable frontier's samples, recomputed from the commit lineage and the
                      sites' work_attempted, are what the writer logged and the canonical prefix
  byte_classes        the six classes never overlap and reconcile with Toxiproxy's counters
                      (within the framing bound; on a link that resent messages, counted may exceed
                      what Toxiproxy saw by at most the resent bytes and the bytes handed to a
                      connection just before it closed; a killed sender's unlogged bytes are taken
                      from its receivers' counters, and its round in flight may be missing)
  lineage             every commit's parent and every durable checkpoint's parent exists; a root
                      commit mid-history only right after a verified restart from the initial weights
  same_frontier       every run of a comparison ends at the same frontier, proven from what was
                      trained (the recomputed retained-sample hashes are equal)
  no_fresh_overwrite  a freshly started process never became a source of truth (donor, commit
                      member, checkpoint writer) before it had loaded the cluster's state (a donor's,
                      the store's, or the initial weights in a verified genesis restart)
  faults_fired        every fault the scenario schedules has an injection in logs/chaos.jsonl

Evidence first: a checker whose logs are absent (the coordinator's, the store's, a site's, the
proxy counters, the chaos log) says `unknown` and names what is missing; it fails if what it could
read already shows a violation, and it never passes on evidence it did not have.
"""

from __future__ import annotations

import itertools
import traceback
from collections import Counter, defaultdict
from typing import Any, Callable

from analysis.check_result import FAIL, MAX_EVIDENCE, PASS, UNKNOWN, CheckResult, _result  # noqa: F401
from analysis.checkers_fresh import check_no_fresh_overwrite
from analysis.load import RunHistory
from analysis.proofs import (COORD, STORE, Announcement, FrontierProof, announcements, expected_sites, fault_schedule,
                             label, missing_logs, prove_frontier, verify_genesis)
from analysis.ledgers import lineage
from analysis.simulated import sim_manifest
from wan.frames import TRAFFIC_CLASSES

# Bytes no traffic class owns, per connection: the ZMTP greeting + CURVE handshake (< 2 KiB) and
# ZMTP heartbeats. A link's Toxiproxy count holds BOTH directions of its connection, and each side
# sends, every heartbeat interval, its own PING and a PONG to the other's: 4 heartbeat commands per
# interval per connection. Each is a CURVE MESSAGE-wrapped ZMTP command: frame header 2 B + "MESSAGE"
# 8 B + nonce 8 B + MAC 16 B + flags 1 B + PING/PONG with TTL 7 B = 42 B (measured: 39 B a command
# on an idle proxied connection, tests/test_heartbeat_bytes.py); HEARTBEAT_COMMAND_BOUND_B leaves
# room for a PING context. The old bound of 128 B/s per connection counted one direction only and
# failed every run longer than about 90 s.
HANDSHAKE_BOUND_B = 2048
HEARTBEAT_COMMAND_BOUND_B = 48
HEARTBEAT_COMMANDS_PER_INTERVAL = 4  # per connection: two sides x (own PING + PONG to the peer's)


def heartbeat_bound_b_per_s(zmq_heartbeat_ivl_ms: float) -> float:
    """Most unowned heartbeat bytes a second one connection carries, both directions together."""
    return HEARTBEAT_COMMANDS_PER_INTERVAL * HEARTBEAT_COMMAND_BOUND_B * 1000.0 / float(zmq_heartbeat_ivl_ms)


def _heartbeat_bound(h: RunHistory) -> float:
    ivl = (h.config.get("wan") or {}).get("zmq_heartbeat_ivl_ms") or 1000
    return heartbeat_bound_b_per_s(ivl)


# Events that act on the cluster's state in the epoch they carry (the epoch of a plain report,
# e.g. a counters snapshot from an I/O thread, is informational).
APPLY_EVENTS = frozenset({"membership", "restore", "round_done", "work_attempted", "collective", "commit",
                          "checkpoint_durable", "checkpoint_write", "state_received", "state_sent",
                          "membership_epoch", "frontier"})
ACTS = APPLY_EVENTS - {"commit"}
REJECTIONS = frozenset({"frame_rejected", "report_rejected", "write_rejected", "commit_refused", "message_rejected"})
_label = label


def _all_logs(h: RunHistory) -> list[str]:
    return [COORD, STORE, *expected_sites(h)]


# ----------------------------------------------------------------------------------------- checkers
def check_log_integrity(runs: list[RunHistory], ctx: dict[str, Any]) -> CheckResult:
    bad, notes, missing = [], [], []
    for h in runs:
        missing += missing_logs(h, _all_logs(h))
        for b in h.bad_lines:
            if b.torn_tail:
                notes.append(f"{_label(h)} {b.path}:{b.line_no}: torn last line (process killed mid-write)")
            else:
                bad.append(f"{_label(h)} {b.path}:{b.line_no}: {b.error}")
        for proc, evs in h.logs.items():
            ids = [e.get("id") for e in evs]
            if len(set(ids)) == len(ids):
                continue
            dup = [i for i, n in Counter(ids).items() if n > 1]
            for i in dup[:5]:
                bad.append(f"{_label(h)} logs/{proc}.jsonl: event id {i} appears more than once")
    n = sum(h.n_events() for h in runs)
    return _result("log_integrity", bad,
                   f"{n:,} events parse, each with a well-typed envelope; every event id is unique; every expected log is there",
                   "{n} unreadable lines, malformed envelopes or repeated event ids", notes, missing)


def _fence_within_process(h: RunHistory, viol: list[str]) -> int:
    """(a) Within one process incarnation the epoch it acts in never goes back. Returns the rejections seen."""
    rejected = 0
    for evs in h.logs.values():
        last: dict[int, tuple[int, str]] = {}
        for e in evs:
            name = e["event"]
            if name not in ACTS:  # commits are checked in (b): an in-flight round may commit after a boundary
                if name in REJECTIONS:
                    rejected += 1
                continue
            ep, pid = e.get("epoch"), e.get("pid", 0)
            if ep is None:
                continue
            prev = last.get(pid)
            if prev is not None and ep < prev[0]:
                viol.append(f"{_label(h)} {e['id']} ({e['event']}): epoch {ep} after {prev[1]} in epoch {prev[0]} "
                            f"(same process, pid {pid})")
            if prev is None or ep > prev[0]:
                last[pid] = (ep, e["id"])
    return rejected


def _fence_commits(h: RunHistory, ann: dict[int, Announcement], viol: list[str]) -> None:
    """(b) Commits only in announced epochs, by that epoch's members, never going back an epoch."""
    lab = _label(h)
    seen: dict[int, Announcement] = {}
    last_commit_epoch = -1
    for e in h.logs.get(COORD, []):
        if e["event"] == "membership_epoch":
            seen[int(e["epoch"])] = ann[int(e["epoch"])]
        elif e["event"] == "commit":
            ep = int(e["epoch"])
            # A round of an older epoch may still commit after a newer epoch was announced, but
            # only a round that was in flight at the boundary (before the newer epoch's start).
            late = [x for x in seen if x > ep and int(e["round"]) >= seen[x].start_round]
            if late:
                viol.append(f"{lab} {e['id']}: commit {e.get('commit_id')} of epoch {ep}, round {e['round']} after "
                            f"epoch {max(late)} started at round {seen[max(late)].start_round} (stale epoch applied)")
            if ep not in seen:
                viol.append(f"{lab} {e['id']}: commit {e.get('commit_id')} in epoch {ep}, never announced")
            elif not set(e.get("members", [])) <= seen[ep].members:
                viol.append(f"{lab} {e['id']}: commit {e.get('commit_id')} members {e.get('members')} "
                            f"are not all members of epoch {ep} {sorted(seen[ep].members)}")
            if ep < last_commit_epoch:
                viol.append(f"{lab} {e['id']}: commit in epoch {ep} after a commit in epoch {last_commit_epoch}")
            last_commit_epoch = max(last_commit_epoch, ep)


def _fence_sites(h: RunHistory, ann: dict[int, Announcement], viol: list[str]) -> None:
    """(c) A site acts only in epochs the coordinator announced; beyond adopting a plan, only in epochs
    that include it."""
    lab = _label(h)
    for site in expected_sites(h):
        for e in h.logs.get(site, []):
            name = e["event"]
            if name not in ACTS or e.get("epoch") is None:
                continue
            ep = int(e["epoch"])
            where = f" round {e['round']}" if "round" in e else ""
            if ep not in ann:
                viol.append(f"{lab} {e['id']} ({name}{where}): {site} acted in epoch {ep}, which the coordinator "
                            "never announced")
            elif name != "membership" and site not in ann[ep].members:
                viol.append(f"{lab} {e['id']} ({name}{where}): {site} acted in epoch {ep}, which does not include "
                            f"it (members {sorted(ann[ep].members)})")


def _fence_store(h: RunHistory, viol: list[str]) -> None:
    """(d) The store makes nothing durable below its fence."""
    fence = 0
    for e in h.logs.get(STORE, []):
        if e["event"] == "store_fence_raised":
            fence = max(fence, int(e.get("fence_epoch", 0)))
        elif e["event"] == "checkpoint_durable" and int(e.get("epoch", fence)) < fence:
            viol.append(f"{_label(h)} {e['id']}: checkpoint {e.get('ckpt_id')} durable in epoch {e.get('epoch')} "
                        f"below the store's fence {fence}")


def check_fencing(runs: list[RunHistory], ctx: dict[str, Any]) -> CheckResult:
    viol: list[str] = []
    missing: list[str] = []
    rejected = 0
    for h in runs:
        missing += missing_logs(h, _all_logs(h))
        rejected += _fence_within_process(h, viol)
        if h.logs.get(COORD):
            ann = announcements(h)
            _fence_commits(h, ann, viol)
            _fence_sites(h, ann, viol)
        _fence_store(h, viol)
    return _result("fencing", viol,
                   f"no stale-epoch apply in {len(runs)} run(s); every site acted only in epochs the coordinator "
                   f"announced; {rejected} stale or foreign messages were rejected and logged, none applied",
                   "{n} actions in a stale, foreign or unannounced epoch", None, missing)


def _ledger_agreement(h: RunHistory, viol: list[str]) -> None:
    """Independent of the ledger's own arithmetic: every retained sample once, and the sites' logs agree
    with the coordinator's record of what each member contributed."""
    lab = _label(h)
    chain = lineage(h.events(COORD, "commit"))
    kept = {(c["epoch"], c["round"]): frozenset(c.get("members", ())) for c in chain}
    retained_lists: list[list[int]] = []
    by_round_site: dict[tuple[int, int, str], int] = defaultdict(int)
    for site in expected_sites(h):
        for e in h.attempts(site):
            members = kept.get((e["epoch"], e["round"]))
            if members is not None and site in members:
                retained_lists.append(e["samples"])
                by_round_site[(e["epoch"], e["round"], site)] += e["tokens"]
    flat = list(itertools.chain.from_iterable(retained_lists))
    retained = set(flat)
    if len(retained) != len(flat):  # only then count which (the common case stays one pass in C)
        twice = [s for s, n in Counter(flat).items() if n > 1]
        viol.append(f"{lab}: {len(twice)} canonical samples retained more than once (e.g. {sorted(twice)[:5]})")
    absent = {s for s in expected_sites(h) if not h.logs.get(s)}  # their share cannot be compared: unknown
    for c in chain:
        for site, tok in (c.get("tokens") or {}).items():
            if site in absent:
                continue
            got = by_round_site.get((c["epoch"], c["round"], site), 0)
            if got != int(tok):
                viol.append(f"{lab} commit {c.get('commit_id')} ({c['id']}): coordinator records {tok} tokens "
                            f"from {site}, {site}'s log has {got}")
    if chain and not absent:
        end = int(chain[-1].get("cursor_end", 0))
        if len(retained) != end:
            viol.append(f"{lab}: the lineage ends at cursor {end} but {len(retained)} distinct samples are retained")


def _proof(h: RunHistory, ctx: dict[str, Any]) -> FrontierProof:
    got = ctx.get("proof", {}).get(h.run_id)
    return got if isinstance(got, FrontierProof) else prove_frontier(h)


def check_work_ledger(runs: list[RunHistory], ctx: dict[str, Any]) -> CheckResult:
    viol, notes, missing = [], [], []
    for h in runs:
        lab = _label(h)
        missing += missing_logs(h, [COORD, *expected_sites(h)])
        w = ctx["work"][h.run_id]
        for site, v in w["per_site"].items():
            if v["attempted_tokens"] != v["retained_tokens"] + v["lost_tokens"]:
                viol.append(f"{lab} site {site}: attempted {v['attempted_tokens']} != retained "
                            f"{v['retained_tokens']} + lost {v['lost_tokens']}")
        _ledger_agreement(h, viol)
        proof = _proof(h, ctx)
        viol += proof.problems
        missing += proof.missing
        notes += proof.notes
        t = w["total"]
        notes.append(f"{lab}: attempted {t.get('attempted_tokens', 0):,} = retained {t.get('retained_tokens', 0):,} "
                     f"+ lost {t.get('lost_tokens', 0):,} tokens")
    return _result("work_ledger", viol, "attempted = retained + lost in every run, per site and in total; every "
                   "retained sample once; commit record and site logs agree; the frontier's samples, recomputed from "
                   "the lineage and the sites' logs, are the canonical prefix", "{n} ledger disagreements", notes,
                   missing)


def check_byte_classes(runs: list[RunHistory], ctx: dict[str, Any]) -> CheckResult:
    viol, notes = [], []
    unknown = []
    for h in runs:
        lab = _label(h)
        unknown += missing_logs(h, _all_logs(h))
        b = ctx["bytes"][h.run_id]
        for proc, evs in h.logs.items():
            for e in evs:
                if e["event"] != "wan_counters":
                    continue
                for row in e.get("counters", []):
                    if row.get("cls") not in TRAFFIC_CLASSES:
                        viol.append(f"{lab} {e['id']}: bytes counted in unknown class {row.get('cls')!r}")
        if sum(b["by_class"].values()) != sum(b["by_link"].values()):
            viol.append(f"{lab}: classes sum to {sum(b['by_class'].values())} but links to {sum(b['by_link'].values())}"
                        " (a byte counted twice or in no class)")
        rec = ctx["reconciliation"][h.run_id]
        if rec.get("evidence") != "measured":
            why = ("a simulated run: no Toxiproxy counts its bytes, so nothing reconciles them"
                   if sim_manifest(h.run_dir) is not None else rec.get("reason"))
            unknown.append(f"{lab}: no Toxiproxy counters ({why})")
            continue
        dur_s = ctx["duration_s"][h.run_id]
        conns = ctx["connections"][h.run_id]
        for link, row in rec["per_link"].items():
            n = conns.get(link, 1)
            bound = n * (HANDSHAKE_BOUND_B + _heartbeat_bound(h) * dur_s)
            # A process killed with bytes still queued counted them as sent though they never reached
            # the proxy: on links of faulted processes allow 1% of the link's bytes either way.
            slack = 0.01 * max(row["proxy"], row["counted"]) if link in ctx["faulted_links"][h.run_id] else 0
            # Copies handed to ZeroMQ for a peer that was gone, dropped unsent and counted again when resent.
            # Plus bytes handed to a connection just before it closed (the sender's `doubt` counters).
            resent = ctx["retransmitted"][h.run_id].get(link, 0) + ctx.get("in_doubt", {}).get(h.run_id, {}).get(link, 0)
            # A killed sender's collective round in flight may have partly entered the proxy, counted by no one.
            killed = ctx.get("killed_in_flight", {}).get(h.run_id, {}).get(link, 0)
            if not (-(slack + resent) <= row["overhead"] <= bound + slack + killed):
                viol.append(f"{lab} link {link}: Toxiproxy {row['proxy']:,} B vs counted {row['counted']:,} B "
                            f"(difference {row['overhead']:,} B outside [-{slack + resent:,.0f}, "
                            f"{bound + slack + killed:,.0f}])")
            elif row["overhead"] < -slack:
                notes.append(f"{lab} link {link}: counted {-row['overhead']:,} B more than Toxiproxy saw, within the "
                             f"{resent:,} B resent on it after a reconnect or stall")
        for link, n in sorted((b.get("rx_filled") or {}).items()):
            notes.append(f"{lab} link {link}: {n:,} B the killed sender(s) {b.get('killed_senders')} sent after their "
                         "last logged counters, taken from the receivers' counters")
        notes.append(f"{lab}: Toxiproxy {rec['proxy_total']:,} B, classes {rec['counted_total']:,} B, "
                     f"framing overhead {100 * rec['overhead_fraction']:.3f}%")
    if not viol and unknown:
        return CheckResult("byte_classes", UNKNOWN, "cannot reconcile: Toxiproxy's counters or a process's log "
                           "is missing", unknown[:MAX_EVIDENCE])
    return _result("byte_classes", viol, "six classes, no byte in two; every link reconciles with Toxiproxy "
                   "within the framing bound", "{n} byte-accounting disagreements", notes)


def _root_commit(h: RunHistory, c: dict[str, Any], pos: int, prev_pos: int, ann: dict[int, Announcement],
                 viol: list[str], missing: list[str]) -> None:
    """A parent-less commit after other commits: legal only right after a verified genesis restart (every
    member restored the initial weights), as round 0 from cursor 0, with no commit in between."""
    lab = _label(h)
    what = f"{lab} {c['id']}: commit {c.get('commit_id')} (epoch {c['epoch']}, round {c['round']}) has no parent"
    between = sorted((a for a in ann.values() if prev_pos < a.position < pos), key=lambda a: a.position)
    genesis = [a for a in between if a.is_genesis]
    if not genesis:
        viol.append(f"{what} after other commits, but no epoch announced since the previous commit restarts "
                    "everyone from the initial weights")
        return
    g = genesis[-1]
    since = [a for a in between if a.position >= g.position]
    if int(c["round"]) != 0 or int(c.get("cursor_start", 0)) != 0:
        viol.append(f"{what}: after the restart from the initial weights in epoch {g.epoch} it must be round 0 "
                    f"from cursor 0, not round {c['round']} from cursor {c.get('cursor_start')}")
    if int(c["epoch"]) not in {a.epoch for a in since}:
        viol.append(f"{what}: its epoch was not announced since the restart from the initial weights (epoch {g.epoch})")
    later = [a.epoch for a in since[1:] if a.start_round != 0]
    if later:
        viol.append(f"{what}: epochs {later} after the restart of epoch {g.epoch} do not start from round 0")
    check = verify_genesis(h, g)
    viol += list(check.problems)
    missing += list(check.missing)


def check_lineage(runs: list[RunHistory], ctx: dict[str, Any]) -> CheckResult:
    viol, notes, missing = [], [], []
    for h in runs:
        lab = _label(h)
        missing += missing_logs(h, [COORD, STORE])
        ann = announcements(h)
        seen: set[str] = set()
        prev_pos, roots = -1, 0
        for pos, c in enumerate(h.logs.get(COORD, [])):
            if c["event"] != "commit":
                continue
            p = c.get("parent")
            if p is None and seen:
                roots += 1
                _root_commit(h, c, pos, prev_pos, ann, viol, missing)
            elif p is not None and p not in seen:
                viol.append(f"{lab} {c['id']}: commit {c.get('commit_id')} names parent {p}, which was never committed")
            seen.add(c["commit_id"])
            prev_pos = pos
        durable: set[str] = set()
        for e in h.logs.get(STORE, []):
            if e["event"] == "checkpoint_durable":
                p = e.get("parent")
                if p is not None and p not in durable:
                    viol.append(f"{lab} {e['id']}: checkpoint {e.get('ckpt_id')} names parent {p[:12]}, "
                                "not an earlier durable checkpoint")
                durable.add(e["manifest_hash"])
        for e in h.logs.get(COORD, []):
            if e["event"] == "frontier" and e.get("commit_id") and e["commit_id"] not in seen:
                viol.append(f"{lab} {e['id']}: frontier at commit {e['commit_id']}, never committed")
        notes.append(f"{lab}: {len(seen)} commits ({roots} new root(s) after a verified restart from the initial "
                     f"weights), {len(durable)} durable checkpoints")
    return _result("lineage", viol, "every commit's and every checkpoint's parent exists; a new root only after a "
                   "verified restart from the initial weights", "{n} dangling parents or unexplained roots", notes,
                   missing)


def check_same_frontier(runs: list[RunHistory], ctx: dict[str, Any]) -> CheckResult:
    proofs = {_label(h): _proof(h, ctx) for h in runs}
    fr = {_label(h): ctx["frontier"][h.run_id] for h in runs}
    lines = [f"{k}: round {fr[k].get('round')}, {p.n_samples if p.n_samples is not None else '?'} retained samples "
             f"recomputed from its lineage, sha256 {p.retained_sha256}" for k, p in proofs.items()]
    problems = [x for p in proofs.values() for x in p.problems]
    if problems:
        return CheckResult("same_frontier", FAIL, "a run's frontier is not what its lineage retained (or it has "
                           "none)", (problems + lines)[:MAX_EVIDENCE], len(problems))
    unproven = [k for k, p in proofs.items() if p.retained_sha256 is None]
    if unproven:
        miss = [x for p in proofs.values() for x in p.missing]
        return CheckResult("same_frontier", UNKNOWN, f"cannot recompute the frontier of {', '.join(unproven)}",
                           (miss + lines)[:MAX_EVIDENCE])
    if len(runs) < 2:
        return CheckResult("same_frontier", UNKNOWN, "one run: nothing to compare its frontier with", lines)
    hashes = {p.retained_sha256 for p in proofs.values()}
    if len(hashes) != 1:
        return CheckResult("same_frontier", FAIL, f"{len(hashes)} different frontiers (retained-sample hashes)",
                           lines, len(hashes) - 1)
    return CheckResult("same_frontier", PASS, f"all {len(runs)} runs end at the same frontier: the same samples, "
                       "recomputed from each run's commit lineage and its sites' work logs", lines)


def check_faults_fired(runs: list[RunHistory], ctx: dict[str, Any]) -> CheckResult:
    viol, notes, missing = [], [], []
    for h in runs:
        fs = ctx.get("faults", {}).get(h.run_id) or fault_schedule(h)
        viol += fs.problems
        missing += fs.missing
        notes += fs.notes
    scheds = [ctx.get("faults", {}).get(h.run_id) or fault_schedule(h) for h in runs]
    n = sum(len(fs.fired) for fs in scheds)
    if not viol and not missing and not any(fs.scheduled for fs in scheds):
        # No evidence either way: a check with nothing to check says so, it does not pass.
        return CheckResult("faults_fired", UNKNOWN, f"no fault was scheduled in {len(runs)} run(s): nothing to check",
                           notes, 0)
    return _result("faults_fired", viol, f"every scheduled fault fired ({n} injection(s) in {len(runs)} run(s))",
                   "{n} scheduled fault(s) did not fire", notes, missing)


CHECKERS: tuple[tuple[str, Callable[[list[RunHistory], dict[str, Any]], CheckResult]], ...] = (
    ("log_integrity", check_log_integrity),
    ("fencing", check_fencing),
    ("work_ledger", check_work_ledger),
    ("byte_classes", check_byte_classes),
    ("lineage", check_lineage),
    ("same_frontier", check_same_frontier),
    ("no_fresh_overwrite", check_no_fresh_overwrite),
    ("faults_fired", check_faults_fired),
)


def run_checkers(runs: list[RunHistory], ctx: dict[str, Any],
                 checkers: tuple[tuple[str, Callable[..., CheckResult]], ...] = CHECKERS) -> list[CheckResult]:
    out = []
    for name, fn in checkers:
        try:
            out.append(fn(runs, ctx))
        except Exception as e:  # a crashing checker is "unknown" with its error, never a dead report
            tb = traceback.format_exception_only(type(e), e)[-1].strip()
            out.append(CheckResult(name, UNKNOWN, "the checker crashed", [tb], 0, error=tb))
    return out
