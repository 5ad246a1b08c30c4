"""A run's numbers, derived once: the ledgers, the frontier, the held-out NLL curve, Toxiproxy's
byte counters and their reconciliation, the checkpoint tree, time per site.

summary.json (analysis/summary.py, written by the launcher at the end of a run) and the artifact
(analysis/artifact.py, `xdc analyze`) both take these numbers from `run_numbers`, so the two cannot
disagree: the summary is a subset of the artifact. Whether a set of runs reached the same frontier
is `matched_frontier`, for `xdc compare`'s index and the artifact's comparison alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from analysis.learning import run_baselines
from analysis.ledgers import byte_ledger, checkpoint_tree, lineage, reconcile, site_time, work_ledger
from analysis.load import RunHistory

SITE_TIME_EVENTS = ("membership", "target_reached", "site_stopped", "compute", "collective", "restore",
                    "checkpoint_write", "eval")  # what analysis.ledgers.site_time reads


@dataclass(frozen=True)
class RunNumbers:
    work: dict[str, Any]  # analysis.ledgers.work_ledger
    commits: list[dict[str, Any]]  # the coordinator's commit events, in log order
    bytes: dict[str, Any]  # analysis.ledgers.byte_ledger
    proxy_bytes: dict[str, Any]  # Toxiproxy's per-proxy totals, or {"error": why not}
    reconciliation: dict[str, Any]
    frontier: dict[str, Any]  # hash, manifest_hash, round, useful_tokens, event_id, evidence
    checkpoint_tree: list[dict[str, Any]]
    site_time: dict[str, dict[str, float]]
    evals: list[dict[str, Any]]  # every site's eval events, by wall-clock time
    baselines: dict[str, Any]
    site_started: dict[str, Any]  # the first site_started event (dataset, device, model size)


def proxy_counters(h: RunHistory) -> dict[str, Any]:
    """Toxiproxy's per-proxy byte totals as the launcher (or `xdc summarize`) logged them."""
    for proc in ("launcher", "summarize"):
        evs = h.events(proc, "proxy_counters")
        if evs:
            return evs[-1].get("proxies") or {"error": "Toxiproxy reported no proxies"}
    return {"error": "no proxy_counters event in the logs (the run predates it, or ended before Toxiproxy was read)"}


def eval_events(h: RunHistory) -> list[dict[str, Any]]:
    """Every site's held-out evaluations, oldest first (wall clock: comparable across machines)."""
    return sorted((e for s in h.sites for e in h.events(s, "eval")), key=lambda e: e["wall_ns"])


def nll_curve(evals: list[dict[str, Any]], t0_ns: int) -> list[dict[str, Any]]:
    """The held-out NLL curve: one point per evaluation; t_s from `t0_ns`, wall_ns its end."""
    return [{"t_s": (int(e["end_wall_ns"]) - t0_ns) / 1e9, "round": e.get("round"),
             "useful_tokens_trained": e.get("useful_tokens_trained"), "heldout_nll": e["heldout_nll"],
             "heldout_nll_se": e.get("heldout_nll_se"), "wall_ns": e["end_wall_ns"], "event_id": e["id"]}
            for e in evals]


def frontier(h: RunHistory, useful_tokens: int) -> dict[str, Any]:
    """The last durable checkpoint and the samples hash its writer logged."""
    durable = h.events("store", "checkpoint_durable")
    writes = [e for s in h.sites for e in h.events(s, "checkpoint_write") if "error" not in e]
    writes.sort(key=lambda e: e["wall_ns"])
    last = durable[-1] if durable else None
    w = next((w for w in reversed(writes) if last and w.get("manifest_hash") == last["manifest_hash"]), None)
    return {"hash": w.get("samples_sha256") if w else None, "manifest_hash": last["manifest_hash"] if last else None,
            "round": last.get("round") if last else None, "useful_tokens": useful_tokens,
            "event_id": last["id"] if last else None, "evidence": "measured"}


def matched_frontier(hashes: list[str | None], proven: list[str | None] | None = None, proof_ok: bool = True) -> bool:
    """Runs reached the same frontier: every logged samples hash is known and equal, and (when the
    proofs are given) so is every hash recomputed from each run's lineage, with no proof problem."""
    if not hashes or None in hashes or len(set(hashes)) != 1:
        return False
    if proven is None:
        return True
    return None not in proven and len(set(proven)) == 1 and proof_ok


def run_numbers(h: RunHistory, proxy_bytes: dict[str, Any] | None = None) -> RunNumbers:
    """Every number summary.json and the artifact share. `proxy_bytes`: Toxiproxy's counters as read
    live (the launcher); None reads them from the logs."""
    sites = h.sites
    # The ledgers read only a few event kinds: hand them those (indexed once) rather than every event.
    commits = h.events("coord", "commit")
    work = work_ledger({**{s: h.attempts(s) for s in sites}, "coord": commits}, sites,
                       int(h.config["model"]["seq_len"]))
    committed = {(c["epoch"], c["round"]) for c in lineage(commits)}
    pids = {p: {e.get("pid", 0) for e in evs} for p, evs in h.logs.items()}
    nbytes = byte_ledger({p: h.events(p, "wan_counters") + h.events(p, "collective") for p in h.logs}, committed,
                         pids)
    proxy = proxy_bytes if proxy_bytes is not None else proxy_counters(h)
    front = frontier(h, work["useful_tokens"])
    evals = eval_events(h)
    st = site_time({s: [e for k in SITE_TIME_EVENTS for e in h.events(s, k)] for s in sites}, sites)
    return RunNumbers(
        work=work, commits=commits, bytes=nbytes, proxy_bytes=proxy, reconciliation=reconcile(nbytes["by_link"], proxy),
        frontier=front, checkpoint_tree=checkpoint_tree(h.logs, front["manifest_hash"]), site_time=st, evals=evals,
        baselines=run_baselines([e for p in ("launcher", "prepare") for e in h.events(p, "baselines")], evals),
        site_started=next((e for s in sites for e in h.events(s, "site_started")), {}))
