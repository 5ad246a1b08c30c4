"""Checkers over the history, in the spirit of Jepsen: each returns pass / fail / unknown with evidence.

A checker is a pure function of the loaded runs (and their ledgers). `run_checkers` calls every
one; a checker that raises yields "unknown" with the error, never a dead report. Each checker
checks something the logs of *different* processes must agree on, so a bug in one process's
bookkeeping shows up as a disagreement rather than being trusted:

  log_integrity       every line parses (a torn last line is allowed) and event ids are unique
  fencing             no process applied anything from an older epoch; commits, rounds and
                      durable checkpoints happen only in announced epochs, by their members
  work_ledger         attempted = retained + lost per site and in total; no canonical sample is
                      retained twice; the coordinator's commit record agrees with the sites' logs
  byte_classes        the six classes never overlap and reconcile with Toxiproxy's counters
                      (within the framing bound; on a link that resent messages, counted may exceed
                      what Toxiproxy saw by at most the resent bytes)
  lineage             every commit's parent and every durable checkpoint's parent exists
  same_frontier       every run of a comparison ends at the same matched-frontier hash
  no_fresh_overwrite  a freshly started process never became a source of truth (donor, commit
                      member, checkpoint writer) before it had loaded the cluster's state
"""

from __future__ import annotations

import traceback
from collections import Counter, defaultdict
import itertools
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from analysis.load import RunHistory
from analysis.summary import lineage
from wan.frames import TRAFFIC_CLASSES

PASS, FAIL, UNKNOWN = "pass", "fail", "unknown"
MAX_EVIDENCE = 20  # lines of evidence kept per checker (the count says how many there were)

# Bytes no traffic class owns, per connection: the ZMTP greeting + CURVE handshake (< 2 KiB) and
# ZMTP heartbeats (< 128 B/s). See tests/test_cluster_e2e.py for where the bounds come from.
HANDSHAKE_BOUND_B = 2048
HEARTBEAT_BOUND_B_PER_S = 128


@dataclass
class CheckResult:
    name: str
    status: str
    summary: str
    evidence: list[str] = field(default_factory=list)
    n_violations: int = 0
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _result(name: str, violations: list[str], ok_summary: str, fail_summary: str,
            notes: list[str] | None = None) -> CheckResult:
    if violations:
        return CheckResult(name, FAIL, fail_summary.format(n=len(violations)), violations[:MAX_EVIDENCE],
                           len(violations))
    return CheckResult(name, PASS, ok_summary, (notes or [])[:MAX_EVIDENCE], 0)


# Events that act on the cluster's state in the epoch they carry (the epoch of a plain report,
# e.g. a counters snapshot from an I/O thread, is informational).
APPLY_EVENTS = frozenset({"membership", "restore", "round_done", "work_attempted", "collective", "commit",
                          "checkpoint_durable", "checkpoint_write", "state_received", "state_sent",
                          "membership_epoch", "frontier"})
ACTS = APPLY_EVENTS - {"commit"}
REJECTIONS = frozenset({"frame_rejected", "report_rejected", "write_rejected", "commit_refused"})


def _label(h: RunHistory) -> str:
    return f"{h.policy}:{h.run_id}"


# ----------------------------------------------------------------------------------------- checkers
def check_log_integrity(runs: list[RunHistory], ctx: dict[str, Any]) -> CheckResult:
    bad, notes = [], []
    for h in runs:
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
    return _result("log_integrity", bad, f"{n:,} events parse; every event id is unique",
                   "{n} unreadable lines or repeated event ids", notes)


def check_fencing(runs: list[RunHistory], ctx: dict[str, Any]) -> CheckResult:
    viol: list[str] = []
    rejected = 0
    for h in runs:
        lab = _label(h)
        # (a) Within one process incarnation the epoch it acts in never goes back.
        for proc, evs in h.logs.items():
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
                    viol.append(f"{lab} {e['id']} ({e['event']}): epoch {ep} after {prev[1]} in epoch {prev[0]} "
                                f"(same process, pid {pid})")
                if prev is None or ep > prev[0]:
                    last[pid] = (ep, e["id"])
        # (b) Commits only in announced epochs, by that epoch's members, never going back an epoch.
        announced: dict[int, set[str]] = {}
        start_round: dict[int, int] = {}
        last_commit_epoch = -1
        for e in h.logs.get("coord", []):
            if e["event"] == "membership_epoch":
                announced[int(e["epoch"])] = set(e.get("members", []))
                start_round[int(e["epoch"])] = int(e.get("start_round", 0))
            elif e["event"] == "commit":
                ep = int(e["epoch"])
                # A round of an older epoch may still commit after a newer epoch was announced, but
                # only a round that was in flight at the boundary (before the newer epoch's start).
                newer = [x for x in announced if x > ep]
                late = [x for x in newer if int(e["round"]) >= start_round[x]]
                if late:
                    viol.append(f"{lab} {e['id']}: commit {e.get('commit_id')} of epoch {ep}, round {e['round']} after "
                                f"epoch {max(late)} started at round {start_round[max(late)]} (stale epoch applied)")
                if ep not in announced:
                    viol.append(f"{lab} {e['id']}: commit {e.get('commit_id')} in epoch {ep}, never announced")
                elif not set(e.get("members", [])) <= announced[ep]:
                    viol.append(f"{lab} {e['id']}: commit {e.get('commit_id')} members {e.get('members')} "
                                f"are not all members of epoch {ep} {sorted(announced[ep])}")
                if ep < last_commit_epoch:
                    viol.append(f"{lab} {e['id']}: commit in epoch {ep} after a commit in epoch {last_commit_epoch}")
                last_commit_epoch = max(last_commit_epoch, ep)
        # (c) A site applies rounds only in epochs that include it.
        for site in h.sites if announced else ():
            for e in h.events(site, "round_done") + h.events(site, "work_attempted"):
                ep = int(e.get("epoch", -1))
                if ep not in announced or site not in announced[ep]:
                    viol.append(f"{lab} {e['id']} ({e['event']}, round {e.get('round')}): applied in epoch {ep}, "
                                f"which {'was never announced' if ep not in announced else 'does not include ' + site}")
        # (d) The store makes nothing durable below its fence.
        fence = 0
        for e in h.logs.get("store", []):
            if e["event"] == "store_fence_raised":
                fence = max(fence, int(e.get("fence_epoch", 0)))
            elif e["event"] == "checkpoint_durable" and int(e.get("epoch", fence)) < fence:
                viol.append(f"{lab} {e['id']}: checkpoint {e.get('ckpt_id')} durable in epoch {e.get('epoch')} "
                            f"below the store's fence {fence}")
    return _result("fencing", viol,
                   f"no stale-epoch apply in {len(runs)} run(s); {rejected} stale or foreign messages were "
                   "rejected and logged, none applied",
                   "{n} actions in a stale or foreign epoch")


def check_work_ledger(runs: list[RunHistory], ctx: dict[str, Any]) -> CheckResult:
    viol, notes = [], []
    for h in runs:
        lab = _label(h)
        w = ctx["work"][h.run_id]
        for site, v in w["per_site"].items():
            if v["attempted_tokens"] != v["retained_tokens"] + v["lost_tokens"]:
                viol.append(f"{lab} site {site}: attempted {v['attempted_tokens']} != retained "
                            f"{v['retained_tokens']} + lost {v['lost_tokens']}")
        commits = [e for e in h.logs.get("coord", []) if e["event"] == "commit"]
        chain = lineage(commits)
        kept = {(c["epoch"], c["round"]): frozenset(c.get("members", ())) for c in chain}
        # Independent of the ledger's own arithmetic: every retained sample once, and the sites'
        # logs agree with the coordinator's record of what each member contributed.
        retained_lists: list[list[int]] = []
        by_round_site: dict[tuple[int, int, str], int] = defaultdict(int)
        for site in h.sites:
            for e in h.events(site, "work_attempted"):
                members = kept.get((e["epoch"], e["round"]))
                if members is not None and site in members:
                    retained_lists.append(e["samples"])
                    by_round_site[(e["epoch"], e["round"], site)] += e["tokens"]
        flat = list(itertools.chain.from_iterable(retained_lists))
        retained = set(flat)
        if len(retained) != len(flat):  # only then count which (the common case stays one pass in C)
            twice = [s for s, n in Counter(flat).items() if n > 1]
            viol.append(f"{lab}: {len(twice)} canonical samples retained more than once (e.g. {sorted(twice)[:5]})")
        for c in chain:
            for site, tok in (c.get("tokens") or {}).items():
                got = by_round_site.get((c["epoch"], c["round"], site), 0)
                if got != int(tok):
                    viol.append(f"{lab} commit {c.get('commit_id')} ({c['id']}): coordinator records {tok} tokens "
                                f"from {site}, {site}'s log has {got}")
        if chain:
            end = int(chain[-1].get("cursor_end", 0))
            if len(retained) != end:
                viol.append(f"{lab}: the lineage ends at cursor {end} but {len(retained)} distinct samples are retained")
        t = w["total"]
        notes.append(f"{lab}: attempted {t.get('attempted_tokens', 0):,} = retained {t.get('retained_tokens', 0):,} "
                     f"+ lost {t.get('lost_tokens', 0):,} tokens")
    return _result("work_ledger", viol, "attempted = retained + lost in every run, per site and in total; every "
                   "retained sample once; commit record and site logs agree", "{n} ledger disagreements", notes)


def check_byte_classes(runs: list[RunHistory], ctx: dict[str, Any]) -> CheckResult:
    viol, notes = [], []
    unknown = []
    for h in runs:
        lab = _label(h)
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
            unknown.append(f"{lab}: no Toxiproxy counters ({rec.get('reason')})")
            continue
        dur_s = ctx["duration_s"][h.run_id]
        conns = ctx["connections"][h.run_id]
        for link, row in rec["per_link"].items():
            n = conns.get(link, 1)
            bound = n * (HANDSHAKE_BOUND_B + HEARTBEAT_BOUND_B_PER_S * dur_s)
            # A process killed with bytes still queued counted them as sent though they never reached
            # the proxy: on links of faulted processes allow 1% of the link's bytes either way.
            slack = 0.01 * max(row["proxy"], row["counted"]) if link in ctx["faulted_links"][h.run_id] else 0
            # Copies handed to ZeroMQ for a peer that was gone, dropped unsent and counted again when resent.
            # Plus bytes handed to a connection just before it closed (the sender's `doubt` counters).
            resent = ctx["retransmitted"][h.run_id].get(link, 0) + ctx.get("in_doubt", {}).get(h.run_id, {}).get(link, 0)
            if not (-(slack + resent) <= row["overhead"] <= bound + slack):
                viol.append(f"{lab} link {link}: Toxiproxy {row['proxy']:,} B vs counted {row['counted']:,} B "
                            f"(difference {row['overhead']:,} B outside [-{slack + resent:,.0f}, {bound + slack:,.0f}])")
            elif row["overhead"] < -slack:
                notes.append(f"{lab} link {link}: counted {-row['overhead']:,} B more than Toxiproxy saw, within the "
                             f"{resent:,} B resent on it after a reconnect or stall")
        notes.append(f"{lab}: Toxiproxy {rec['proxy_total']:,} B, classes {rec['counted_total']:,} B, "
                     f"framing overhead {100 * rec['overhead_fraction']:.3f}%")
    if not viol and unknown:
        return CheckResult("byte_classes", UNKNOWN, "no Toxiproxy counters in the logs of some runs", unknown)
    return _result("byte_classes", viol, "six classes, no byte in two; every link reconciles with Toxiproxy "
                   "within the framing bound", "{n} byte-accounting disagreements", notes)


def check_lineage(runs: list[RunHistory], ctx: dict[str, Any]) -> CheckResult:
    viol, notes = [], []
    for h in runs:
        lab = _label(h)
        seen: set[str] = set()
        commits = [e for e in h.logs.get("coord", []) if e["event"] == "commit"]
        for i, c in enumerate(commits):
            p = c.get("parent")
            if p is None and i > 0 and seen:
                # A root after other commits is legal only when everything restarted from the initial weights.
                pass
            elif p is not None and p not in seen:
                viol.append(f"{lab} {c['id']}: commit {c.get('commit_id')} names parent {p}, which was never committed")
            seen.add(c["commit_id"])
        durable: set[str] = set()
        for e in h.logs.get("store", []):
            if e["event"] == "checkpoint_durable":
                p = e.get("parent")
                if p is not None and p not in durable:
                    viol.append(f"{lab} {e['id']}: checkpoint {e.get('ckpt_id')} names parent {p[:12]}, "
                                "not an earlier durable checkpoint")
                durable.add(e["manifest_hash"])
        for e in h.logs.get("coord", []):
            if e["event"] == "frontier" and e.get("commit_id") and e["commit_id"] not in seen:
                viol.append(f"{lab} {e['id']}: frontier at commit {e['commit_id']}, never committed")
        notes.append(f"{lab}: {len(commits)} commits, {len(durable)} durable checkpoints")
    return _result("lineage", viol, "every commit's and every checkpoint's parent exists", "{n} dangling parents",
                   notes)


def check_same_frontier(runs: list[RunHistory], ctx: dict[str, Any]) -> CheckResult:
    fr = {(_label(h)): ctx["frontier"][h.run_id] for h in runs}
    hashes = {f.get("hash") for f in fr.values()}
    lines = [f"{k}: round {f.get('round')}, {f.get('useful_tokens'):,} useful tokens, hash {f.get('hash')}"
             for k, f in fr.items()]
    if None in hashes:
        return CheckResult("same_frontier", FAIL, "a run has no durable frontier", lines, 1)
    if len(runs) < 2:
        return CheckResult("same_frontier", UNKNOWN, "one run: nothing to compare its frontier with", lines)
    if len(hashes) != 1:
        return CheckResult("same_frontier", FAIL, f"{len(hashes)} different frontier hashes", lines, len(hashes) - 1)
    return CheckResult("same_frontier", PASS, f"all {len(runs)} runs end at the same frontier", lines)


def check_no_fresh_overwrite(runs: list[RunHistory], ctx: dict[str, Any]) -> CheckResult:
    viol, notes = [], []
    for h in runs:
        lab = _label(h)
        commits = [e for e in h.logs.get("coord", []) if e["event"] == "commit"]
        committed_hashes = {c.get("param_hash") for c in commits}
        first_commit_ns = int(commits[0]["wall_ns"]) if commits else None
        fresh = 0
        for site in h.sites:
            evs = h.logs.get(site, [])
            by_pid: dict[int, list[dict[str, Any]]] = defaultdict(list)
            for e in evs:
                by_pid[int(e.get("pid", 0))].append(e)
            for pid, pevs in by_pid.items():
                start = next((e for e in pevs if e["event"] == "site_started"), pevs[0])
                initial_hash = start.get("params_hash")
                if first_commit_ns is None or int(start["wall_ns"]) < first_commit_ns:
                    continue  # started with the cluster: its initial weights are the cluster's state
                fresh += 1
                loaded = False
                for e in pevs:
                    ev = e["event"]
                    if ev == "restore" and e.get("source") in ("donor", "store") and "error" not in e:
                        loaded = True
                    elif ev == "state_received":
                        loaded = True
                    if loaded:
                        continue
                    if ev in ("state_sent", "checkpoint_write", "round_done", "collective", "work_attempted"):
                        viol.append(f"{lab} {e['id']}: {site} (pid {pid}, started after the first commit) logged "
                                    f"{ev} before loading the cluster's state")
            for e in evs:
                if e["event"] == "state_sent" and committed_hashes and e.get("params_hash") not in committed_hashes:
                    viol.append(f"{lab} {e['id']}: {site} sent state {str(e.get('params_hash'))[:12]} that no commit "
                                "produced")
                    if e.get("params_hash") == initial_hash:
                        viol.append(f"{lab} {e['id']}: ... and it is the initial weights")
        for e in h.logs.get("coord", []):
            if e["event"] == "commit" and commits and e is not commits[0] and e.get("parent") is None \
                    and h.policy not in ("restart",):
                notes.append(f"{lab} {e['id']}: commit {e['commit_id']} starts a new root")
        notes.append(f"{lab}: {fresh} freshly started site process(es); each loaded state before acting")
    return _result("no_fresh_overwrite", viol, "no fresh member ever became a source of truth",
                   "{n} actions by a member that had not loaded the cluster's state", notes)


CHECKERS: tuple[tuple[str, Callable[[list[RunHistory], dict[str, Any]], CheckResult]], ...] = (
    ("log_integrity", check_log_integrity),
    ("fencing", check_fencing),
    ("work_ledger", check_work_ledger),
    ("byte_classes", check_byte_classes),
    ("lineage", check_lineage),
    ("same_frontier", check_same_frontier),
    ("no_fresh_overwrite", check_no_fresh_overwrite),
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
