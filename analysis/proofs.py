"""Evidence the checkers share: which logs a run must have, the epochs the coordinator announced,
genesis restarts verified from the plans and the restore events, and the durable frontier proven
from what was trained.

Everything here is a pure function of one `RunHistory` (its logs and manifests). A function that
needs a log the run does not have says so (`missing`), so that a checker built on it can answer
`unknown` rather than pass on absent evidence.

Frontier proof. The durable frontier is the store's last `checkpoint_durable`. Its commit is the
coordinator's `frontier` event for that manifest (or, failing that, the lineage commit of its
round). The samples it contains are *recomputed* from two independent records: the coordinator's
commit lineage up to that commit (which (epoch, round) committed, with which members) and the
sites' own `work_attempted` events (which samples each member trained in that round). Their hash,
sha256 of the sorted sample ids as int64 little-endian bytes, must equal the `samples_sha256` the
writing site logged in its `checkpoint_write` span and, where the site logs it, the
`canonical_sha256` of the canonical prefix: the retained set is then exactly the canonical prefix.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analysis.load import RunHistory
from analysis.ledgers import lineage

COORD, STORE = "coord", "store"
INITIAL = "initial weights"  # the `source` a restore span logs when it loads the initial weights

WHAT = {COORD: "the coordinator's log: epochs and the commit record",
        STORE: "the checkpoint store's log: durable checkpoints and its fence"}


def label(h: RunHistory) -> str:
    return f"{h.policy}:{h.run_id}"


def expected_sites(h: RunHistory) -> list[str]:
    """The sites the run was configured with (topology.json, else config.json)."""
    topo = list(h.topology.get("sites") or [])
    return topo or h.sites


def missing_logs(h: RunHistory, processes: list[str]) -> list[str]:
    """One line per expected process whose log is absent or empty."""
    out = []
    for p in processes:
        if not h.logs.get(p):
            what = WHAT.get(p, f"site {p}'s log")
            out.append(f"{label(h)}: no logs/{p}.jsonl ({what})")
    return out


def sha256_of_ids(ids: set[int] | list[int]) -> str:
    """sha256 of the sorted sample ids as int64 little-endian bytes (the sites' `samples_sha256`)."""
    return hashlib.sha256(np.asarray(sorted(ids), dtype="<i8").tobytes()).hexdigest()


# ------------------------------------------------------------------------------------------ epochs
@dataclass(frozen=True)
class Announcement:
    """One `membership_epoch` the coordinator logged (its plan), and where it sits in the coordinator's log."""
    epoch: int
    members: frozenset[str]
    start_round: int
    start_cursor: int
    restore: str
    manifest_hash: str | None
    position: int  # index in the coordinator's log (file order: one process, appended across restarts)
    event_id: str

    @property
    def is_genesis(self) -> bool:
        """The plan restarts everyone from the initial weights: restore from the store with nothing durable."""
        return self.restore == "store" and self.manifest_hash is None and self.start_round == 0 \
            and self.start_cursor == 0


def announcements(h: RunHistory) -> dict[int, Announcement]:
    out: dict[int, Announcement] = {}
    for i, e in enumerate(h.logs.get(COORD, [])):
        if e["event"] == "membership_epoch":
            ep = int(e["epoch"])
            out[ep] = Announcement(ep, frozenset(e.get("members", ())), int(e.get("start_round", 0)),
                                   int(e.get("start_cursor", 0)), str(e.get("restore", "none")),
                                   e.get("manifest_hash"), i, str(e["id"]))
    return out


def initial_hashes(h: RunHistory, site: str) -> dict[int, str | None]:
    """pid -> the params hash each incarnation of `site` started with (its `site_started`)."""
    return {int(e.get("pid", 0)): e.get("params_hash") for e in h.events(site, "site_started")}


@dataclass(frozen=True)
class GenesisCheck:
    """Whether every member of a genesis epoch restored the initial weights (and what is missing)."""
    epoch: int
    verified: bool
    problems: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()


def verify_genesis(h: RunHistory, a: Announcement) -> GenesisCheck:
    """A genesis plan is honoured when every member logged, in that epoch, a successful restore from
    the initial weights whose params hash is the initial hash its incarnation started with."""
    lab = label(h)
    if not a.is_genesis:
        return GenesisCheck(a.epoch, False, (f"{lab} epoch {a.epoch} ({a.event_id}): the plan restores "
                                             f"'{a.restore}' from round {a.start_round} (manifest "
                                             f"{str(a.manifest_hash)[:12]}), not from the initial weights",))
    problems: list[str] = []
    missing = missing_logs(h, sorted(a.members))
    for site in sorted(a.members):
        if not h.logs.get(site):
            continue
        starts = initial_hashes(h, site)
        ok = [e for e in h.events(site, "restore") if int(e.get("epoch", -1)) == a.epoch
              and e.get("source") == INITIAL and "error" not in e
              and e.get("params_hash") is not None and e.get("params_hash") == starts.get(int(e.get("pid", 0)))]
        if not ok:
            problems.append(f"{lab} epoch {a.epoch} ({a.event_id}) restarts from the initial weights, but {site} "
                            "logged no restore from the initial weights (with its initial params hash) in it")
    return GenesisCheck(a.epoch, not problems and not missing, tuple(problems), tuple(missing))


# ----------------------------------------------------------------------------------------- frontier
@dataclass(frozen=True)
class FrontierProof:
    """The durable frontier's samples recomputed from the commit lineage and the sites' work logs."""
    status: str  # "proven" | "mismatch" | "unknown"
    retained_sha256: str | None = None
    n_samples: int | None = None
    logged_samples_sha256: str | None = None
    canonical_sha256: str | None = None
    commit_id: str | None = None
    manifest_hash: str | None = None
    problems: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "retained_sha256": self.retained_sha256, "n_samples": self.n_samples,
                "logged_samples_sha256": self.logged_samples_sha256, "canonical_sha256": self.canonical_sha256,
                "commit_id": self.commit_id, "problems": list(self.problems), "missing": list(self.missing)}


def _frontier_commit(h: RunHistory, chain: list[dict[str, Any]], durable: dict[str, Any]) -> dict[str, Any] | None:
    by_id = {c["commit_id"]: c for c in chain}
    for e in reversed(h.events(COORD, "frontier")):
        if e.get("manifest_hash") == durable["manifest_hash"] and e.get("commit_id") in by_id:
            return by_id[e["commit_id"]]
    same_round = [c for c in chain if int(c["round"]) == int(durable.get("round", -1))]
    return same_round[-1] if same_round else None


def retained_samples(h: RunHistory, chain: list[dict[str, Any]]) -> list[int]:
    """Every sample id the members of these commits trained in those rounds (a list: duplicates kept)."""
    kept = {(c["epoch"], c["round"]): frozenset(c.get("members", ())) for c in chain}
    lists = [e["samples"] for site in expected_sites(h) for e in h.attempts(site)
             if site in kept.get((e["epoch"], e["round"]), ())]
    return list(itertools.chain.from_iterable(lists))


def prove_frontier(h: RunHistory) -> FrontierProof:
    lab = label(h)
    missing = tuple(missing_logs(h, [COORD, STORE, *expected_sites(h)]))
    if missing:
        return FrontierProof("unknown", missing=missing)
    durable_all = h.events(STORE, "checkpoint_durable")
    if not durable_all:
        return FrontierProof("mismatch", problems=(f"{lab}: the store made no checkpoint durable: no frontier",))
    durable = durable_all[-1]
    mh = durable["manifest_hash"]
    write = next((w for s in expected_sites(h) for w in reversed(h.events(s, "checkpoint_write"))
                  if w.get("manifest_hash") == mh and "error" not in w), None)
    chain = lineage(h.events(COORD, "commit"))
    commit = _frontier_commit(h, chain, durable)
    problems: list[str] = []
    if write is None:
        problems.append(f"{lab}: no site logged writing the frontier checkpoint {mh[:12]} ({durable['id']})")
    if commit is None:
        problems.append(f"{lab}: the frontier {mh[:12]} (round {durable.get('round')}) is not a commit of the "
                        "final lineage")
    if problems:
        return FrontierProof("mismatch", manifest_hash=mh, problems=tuple(problems))
    assert write is not None and commit is not None
    prefix = chain[:chain.index(commit) + 1]
    flat = retained_samples(h, prefix)
    ids = set(flat)
    digest = sha256_of_ids(ids)
    logged, canonical = write.get("samples_sha256"), write.get("canonical_sha256")
    if len(ids) != len(flat):
        twice = sorted(s for s, n in Counter(flat).items() if n > 1)
        problems.append(f"{lab}: {len(twice)} samples retained more than once up to the frontier (e.g. {twice[:5]})")
    cursor = int(write.get("cursor", commit.get("cursor_end", -1)))
    if len(ids) != cursor:
        problems.append(f"{lab}: the frontier is at cursor {cursor} but its lineage retained {len(ids)} distinct samples")
    if digest != logged:
        problems.append(f"{lab}: the frontier's samples recomputed from the commit lineage and the sites' "
                        f"work_attempted ({len(ids)} samples, sha256 {digest[:16]}) differ from the samples_sha256 "
                        f"{str(logged)[:16]} that {write['id']} logged")
    notes: list[str] = []
    if canonical is None:
        missing = (f"{lab}: {write['id']} logged no canonical_sha256, so the retained set cannot be compared "
                   "with the canonical prefix",)
    elif digest != canonical:
        problems.append(f"{lab}: the retained samples (sha256 {digest[:16]}) are not the canonical prefix of "
                        f"{cursor} samples (canonical_sha256 {canonical[:16]}, {write['id']})")
    else:
        notes.append(f"{lab}: {len(ids)} retained samples = the canonical prefix (sha256 {digest[:16]})")
    status = "mismatch" if problems else ("unknown" if missing else "proven")
    return FrontierProof(status, digest, len(ids), logged, canonical, commit["commit_id"], mh, tuple(problems),
                         missing, tuple(notes))


# ------------------------------------------------------------------------------------------- faults
TRIGGERS = (("at_useful_tokens", "at {:,} useful tokens"), ("at_step", "at step {}"), ("at_s", "at t={} s"))


def describe_fault(f: dict[str, Any]) -> str:
    """'site_crash of b at 36,864 useful tokens' (the trigger as the scenario wrote it)."""
    when = next((fmt.format(f[k]) for k, fmt in TRIGGERS if f.get(k) is not None), "")
    trig = f.get("trigger") if isinstance(f.get("trigger"), dict) else {}
    when = when or next((fmt.format(trig[k]) for k, fmt in TRIGGERS if trig.get(k) is not None), "")
    return f"{f.get('kind')} of {f.get('target')}" + (f" {when}" if when else "")


@dataclass(frozen=True)
class FaultSchedule:
    """What the run's scenario scheduled and what the chaos log shows fired."""
    scheduled: tuple[dict[str, Any], ...]
    fired: tuple[int, ...]  # indices of scheduled faults with a real (not dry-run) injection
    not_fired: tuple[dict[str, Any], ...]  # {index, kind, target, description, reason}
    problems: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"scheduled": len(self.scheduled), "fired": list(self.fired), "not_fired": list(self.not_fired),
                "evidence": "unavailable" if self.missing else "measured",
                **({"missing": list(self.missing)} if self.missing else {})}


def _why_not_fired(i: int, f: dict[str, Any], chaos: list[dict[str, Any]], target_tokens: int | None) -> str:
    failed = [e for e in chaos if e["event"] == "fault_failed" and e.get("fault") == i and e.get("phase") == "inject"]
    if failed:
        return f"its injection failed ({failed[-1]['id']}: {failed[-1].get('error')})"
    finished = next((e for e in reversed(chaos) if e["event"] == "scenario_finished"), None)
    at = f.get("at_useful_tokens")
    beyond = (f"; it triggers at {int(at):,} useful tokens, beyond the run's target of {target_tokens:,}"
              if at is not None and target_tokens is not None and int(at) > target_tokens else "")
    if finished is None:
        return "the chaos driver logged no scenario_finished (it stopped early)" + beyond
    if i in (finished.get("never_fired") or []):
        return f"its trigger was never met before the run ended ({finished['id']})" + beyond
    return f"no fault_injected for it (status {finished.get('statuses', {}).get(str(i))!r} at {finished['id']})" + beyond


def fault_schedule(h: RunHistory) -> FaultSchedule:
    """Every fault the scenario schedules must have a `fault_injected` in logs/chaos.jsonl."""
    lab = label(h)
    chaos = h.logs.get("chaos", [])
    started = next((e for e in chaos if e["event"] == "scenario_started"), None)
    sched = (h.scenario or {}).get("faults") if h.scenario is not None else (started or {}).get("faults")
    if sched is None:
        launched = any(e["event"] == "run_started" for p in ("launcher", "prepare") for e in h.logs.get(p, []))
        if chaos or not launched:
            why = ("a chaos log but neither scenario.json nor a scenario_started event" if chaos else
                   "no scenario.json, no chaos log and no launcher log")
            return FaultSchedule((), (), (), missing=(f"{lab}: {why}: cannot tell which faults were scheduled",))
        return FaultSchedule((), (), (), notes=(f"{lab}: no scenario was given (no scenario.json, no chaos log): "
                                                "no fault was scheduled",))
    sched = tuple(sched)
    if sched and not chaos:
        return FaultSchedule(sched, (), (), missing=(f"{lab}: the scenario schedules {len(sched)} fault(s) but there "
                                                     "is no logs/chaos.jsonl to show them fired",))
    injected: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in chaos:
        if e["event"] == "fault_injected" and e.get("fault") is not None:
            injected[int(e["fault"])].append(e)
    target = h.config.get("train", {}).get("target_useful_tokens")
    fired, not_fired, problems = [], [], []
    for i, f in enumerate(sched):
        real = [e for e in injected.get(i, []) if not e.get("noop") or f.get("kind") == "noop"]
        if real:
            fired.append(i)
            continue
        why = ("it ran as a dry run (noop): nothing was injected" if injected.get(i)
               else _why_not_fired(i, f, chaos, int(target) if target is not None else None))
        not_fired.append({"index": i, "kind": f.get("kind"), "target": f.get("target"),
                          "description": describe_fault(f), "reason": why})
        problems.append(f"{lab}: scheduled fault {i} ({describe_fault(f)}) did not fire: {why}")
    for i in sorted(set(injected) - set(range(len(sched)))):
        problems.append(f"{lab} {injected[i][0]['id']}: injected fault {i}, which the scenario does not schedule")
    ids = ", ".join(injected[i][0]["id"] for i in fired)
    notes = (f"{lab}: {len(fired)} of {len(sched)} scheduled fault(s) fired" + (f" ({ids})" if ids else ""),)
    return FaultSchedule(sched, tuple(fired), tuple(not_fired), tuple(problems), (), notes)
