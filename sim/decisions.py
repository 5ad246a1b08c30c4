"""The recovery decisions of a run (emulated or simulated), and how two runs' decisions compare.

A decision is a `membership_epoch` the coordinator logged: its epoch number, members, restore
kind, donor, joiners, drain, start round and cursor, and its reason. Two runs of the same
scenario and policy agree when every decision has the same epoch, members, restore, donor,
joiners, drain and reason *with its numbers masked*; the numbers (start round, cursor, the
rounds named in the reason) depend on timing (how fast a restarted process came back), so they
are compared and reported separately.

An emulated run on a shared machine can fail a site the scenario never touched (a heartbeat
timeout under load). Decisions from the first such unscheduled failure on follow from it, not
from the scenario: only the prefix before it is comparable, and the comparison says so. Likewise
either run can end before a site the scenario restarted has joined again (a slow restart under
load, or a simulated run that reached its target first), or see it join only when no round is left
to admit it (after its last commit, or while its last round is in flight: the coordinator says so):
the other run's decisions that only add that site back are reported as a prefix match, with the
reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ground.eventlog import process_events as _events

STRUCTURE = ("epoch", "members", "restore", "donor", "joiners", "drain_site", "reason_shape")
NUMBERS = ("start_round", "start_cursor", "reason")


def shape(reason: str) -> str:
    return re.sub(r"\d+", "#", reason)


def decision_of(e: dict[str, Any]) -> dict[str, Any]:
    drain = e.get("drain") or {}
    return {"epoch": e["epoch"], "members": list(e.get("members", [])), "restore": e.get("restore"),
            "donor": e.get("donor"), "joiners": list(e.get("joiners") or []), "drain_site": drain.get("site"),
            "start_round": e.get("start_round"), "start_cursor": e.get("start_cursor"), "reason": e.get("reason", ""),
            "reason_shape": shape(e.get("reason", ""))}


def _logs(run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The run's coordinator and chaos logs, read once for every question below."""
    return _events(run_dir, "coord"), _events(run_dir, "chaos")


def _unscheduled(coord: list[dict[str, Any]], chaos: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first `site_failed` of a site no injected fault had taken down by then (None: there is none)."""
    downs = [(e["mono_ns"], e.get("target")) for e in chaos if e["event"] == "fault_injected" and not e.get("noop")]
    for e in coord:
        if e["event"] != "site_failed":
            continue
        if not any(t == e.get("site") and t_ns <= e["mono_ns"] for t_ns, t in downs):
            return e
    return None


# The recovery decision of a joiner that came when the run's last round was already in flight
# (coordinator/recovery.py): no boundary is left to admit it. Group 1: the joiners, as a Python list.
TOO_LATE = re.compile(r": (\[[^\]]*\]) wait: the run ends with the round in flight$")


def _told_too_late(coord: list[dict[str, Any]], since_ns: int) -> set[str]:
    """Sites the coordinator said, after `since_ns`, that it could no longer admit (TOO_LATE) and
    did not admit after all (no later epoch has them as members)."""
    out: set[str] = set()
    for i, e in enumerate(coord):
        if e["event"] != "recovery_decision" or e["mono_ns"] < since_ns:
            continue
        m = TOO_LATE.search(str(e.get("reason", "")))
        if m is None:
            continue
        for site in re.findall(r"'([^']*)'", m.group(1)):
            if not any(x["event"] == "membership_epoch" and site in (x.get("members") or []) for x in coord[i:]):
                out.add(site)
    return out


def _unjoined(coord: list[dict[str, Any]], chaos: list[dict[str, Any]],
              by_last_commit: bool = False) -> dict[str, float]:
    """Restarted sites that had not joined again by the run's end (`by_last_commit`: by its last
    commit, after which no round is left to admit a site, so a later join decides nothing; or whose
    join the coordinator answered that the run ends with the round in flight, and never admitted):
    site -> seconds from its restart to that end."""
    if not coord:
        return {}
    end_ns = coord[-1]["mono_ns"]
    if by_last_commit:
        end_ns = max((c["mono_ns"] for c in coord if c["event"] == "commit"), default=end_ns)
    out: dict[str, float] = {}
    for e in chaos:
        if e["event"] == "fault_healed" and (e.get("result") or {}).get("restarted"):
            site = e.get("target")
            if not any(j["event"] == "site_joined" and j.get("site") == site and e["mono_ns"] <= j["mono_ns"] <= end_ns
                       for j in coord) or (by_last_commit and site in _told_too_late(coord, e["mono_ns"])):
                out[str(site)] = (end_ns - e["mono_ns"]) / 1e9
    return out


def unjoined_restarts(run_dir: Path) -> dict[str, float]:
    """Sites a fault restarted that had not joined again when the run ended: site -> seconds from
    the restart to the run's last coordinator event (their restart time is censored: at least that)."""
    return _unjoined(*_logs(run_dir))


def _decisions(coord: list[dict[str, Any]], bad: dict[str, Any] | None) -> list[dict[str, Any]]:
    out = []
    for e in coord:
        if bad is not None and e["mono_ns"] >= bad["mono_ns"]:
            break
        if e["event"] == "membership_epoch":
            out.append(decision_of(e))
    return out


def run_decisions(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The run's decisions before its first unscheduled failure, and that failure (or None)."""
    coord, chaos = _logs(run_dir)
    bad = _unscheduled(coord, chaos)
    return _decisions(coord, bad), bad


@dataclass
class Comparison:
    policy: str
    status: str  # "match" (every decision), "prefix match" (up to an unscheduled failure), "mismatch"
    compared: int
    emulator_decisions: int
    simulator_decisions: int
    structural_mismatches: list[str] = field(default_factory=list)
    timing_differences: list[str] = field(default_factory=list)
    disturbed_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _censored(late: dict[str, float], extra: list[dict[str, Any]]) -> bool:
    """Whether every decision one run made beyond the other's end only adds back a site the shorter
    run restarted but had not seen join again (`late`): beyond what the shorter run showed, not against it."""
    return bool(late) and bool(extra) and all(set(d["joiners"]) & set(late) for d in extra)


def compare_runs(emulated: Path, simulated: Path, policy: str = "") -> Comparison:
    coord, chaos = _logs(emulated)
    bad = _unscheduled(coord, chaos)
    emu = _decisions(coord, bad)
    sim_coord, sim_chaos = _logs(simulated)
    sim = _decisions(sim_coord, _unscheduled(sim_coord, sim_chaos))
    n = len(emu)
    mism, timing = [], []
    # One run ended before a restarted site came back, the other saw it join: the emulator's restart
    # was slow on a loaded machine, or the simulated run reached its target first (its restart time is
    # a fitted median). The decisions that only add that site back cannot be compared.
    late = _unjoined(coord, chaos, by_last_commit=True) if bad is None and len(sim) > n else {}
    late_sim = _unjoined(sim_coord, sim_chaos, by_last_commit=True) if bad is None and len(sim) < n else {}
    censored = _censored(late, sim[n:])
    censored_sim = _censored(late_sim, emu[len(sim):])
    if (len(sim) < n and not censored_sim) or (bad is None and len(sim) > n and not censored):
        mism.append(f"{len(emu)} emulator decisions{' (comparable prefix)' if bad else ''}, {len(sim)} simulated")
    for a, b in zip(emu, sim[:n]):
        diff = [k for k in STRUCTURE if a[k] != b[k]]
        if diff:
            mism.append(f"epoch {a['epoch']}: " + "; ".join(f"{k} {a[k]!r} vs {b[k]!r}" for k in diff))
        tdiff = [k for k in NUMBERS if a[k] != b[k]]
        if tdiff:
            timing.append(f"epoch {a['epoch']}: " + "; ".join(f"{k} {a[k]!r} vs {b[k]!r}" for k in tdiff))
    why = None
    if bad is not None:
        why = f"{bad['id']}: {bad.get('site')} failed ({bad.get('reason')}), which no fault of the scenario caused"
    if (censored or censored_sim) and not mism:
        which, gone = ("emulator's", late) if censored else ("simulated", late_sim)
        why = f"the {which} run ended, or made its last commit, before " + ", ".join(
            f"{site} joined again ({t:.1f} s after its restart)" for site, t in sorted(gone.items()))
    status = "mismatch" if mism else ("prefix match" if bad is not None or censored or censored_sim else "match")
    return Comparison(policy, status, min(n, len(sim)), len(emu), len(sim), mism, timing, why)
