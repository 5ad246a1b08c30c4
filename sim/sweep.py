"""Sweeps of the simulator: sites x failure rate x bandwidth x policy x mode, in parallel.

Each cell is one simulation (no logs written) of `sim_s` virtual seconds: N sites, the site links
capped at a bandwidth (KB/s; 0 = the config's, unshaped), a consistency mode, a recovery policy, and
site crashes drawn as a Poisson process at `rate` failures per site-hour, each site back
`repair_s` later (a new incarnation that rejoins). The fault schedule of a cell depends on
(seed, sites, rate, bandwidth, mode) and not on the policy, so the policies are compared on the
same faults (paired). Goodput: useful tokens in the commit record per simulated second. Each failure
rate is drawn over several seeds (`--seeds`, 3 by default): one draw of a Poisson schedule at a low
rate may hold no crash at all, or a crash at a lucky moment, and a ranking from it says nothing; the
summary gives the mean and range per policy, and names one policy best only where it dominates the
others (at least as good on every seed's schedule, better on two draws); `a ~ b`: not told apart.

Where the cells run: local worker processes (concurrent.futures, one per core by default), or an
existing Dask distributed cluster given its scheduler address (`--scheduler tcp://HOST:PORT`).
Dask rather than Ray: a cell is a pure function of a small picklable value, which is exactly
`Client.map`; `dask-scheduler` / `dask-worker` are plain processes one can start on any host with
this package installed, and `LocalCluster` lets the test suite start a real cluster in seconds.
Both paths run the same `run_cell`, so their results are equal (tests/{unit,live}/test_sim_sweep.py).

Failure rates at scale are a `prior`: FLEET_PRIOR (Llama 3's 419 unexpected interruptions in 54
days on 16,384 GPUs) as a per-GPU rate, times the GPUs behind one site. `oracle` sees only
progress-triggered faults; a fleet's failures are time-triggered, so in a sweep it has no
foresight and behaves as `elastic` (it is not in the default policies for that reason).
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from itertools import product
from typing import Any, Callable, Iterable

import numpy as np

from chaos.scenario import Scenario
from ground.config import LinkSpec, load_config
from sim.model import SimModel
from sim.world import simulate

# Meta, "The Llama 3 Herd of Models" (arXiv:2407.21783, section 3.3.4): 419 unexpected
# interruptions during a 54-day snapshot of pre-training on 16,384 H100 GPUs.
FLEET_PRIOR = {"interruptions": 419, "days": 54, "gpus": 16_384, "evidence": "prior",
               "source": "Meta, The Llama 3 Herd of Models, arXiv:2407.21783, sec. 3.3.4 (419 unexpected "
                         "interruptions in 54 days on 16,384 GPUs)"}
PER_GPU_HOUR = FLEET_PRIOR["interruptions"] / (FLEET_PRIOR["days"] * 24 * FLEET_PRIOR["gpus"])  # ~1.97e-5


def prior_rate(gpus_per_site: int) -> float:
    """Failures per site-hour of a site of `gpus_per_site` GPUs under the fleet prior (independent GPUs)."""
    return PER_GPU_HOUR * gpus_per_site


RATE_EVIDENCE = {"prior": "the fleet prior (FLEET_PRIOR) times the GPUs behind one site (--gpus-per-site)",
                 "given": "given with --rates (the user's input: no published source behind it)"}


def rates_label(results: list[dict[str, Any]]) -> str:
    """How a sweep's failure rates are labelled: "prior", "given", or both joined ("given+prior")
    when results of both kinds were merged (a result without the field is from the prior)."""
    return "+".join(sorted({r.get("rate_evidence", "prior") for r in results})) or "prior"


DEFAULT_GPUS_PER_SITE = (0, 1_024, 8_192, 65_536)  # rates 0, ~0.020, ~0.16, ~1.3 per site-hour


@dataclass(frozen=True)
class Cell:
    sites: int
    rate_per_site_h: float  # failures per site-hour (Poisson)
    bandwidth_kbps: int  # site links' bandwidth, both directions (0: unshaped)
    policy: str
    mode: str  # "sync" or "local" (DiLoCo, H from the config)
    sim_s: float
    repair_s: float
    seed: int
    # Where the rate came from: "prior" (the fleet prior times the GPUs behind a site, --gpus-per-site)
    # or "given" (--rates: the user's own input, no published source behind it).
    rate_evidence: str = "prior"

    def fault_key(self) -> tuple[Any, ...]:
        """What the fault schedule depends on (not the policy: the policies meet the same faults)."""
        return (self.seed, self.sites, self.rate_per_site_h, self.bandwidth_kbps, self.mode, self.sim_s,
                self.repair_s)


def site_names(n: int) -> list[str]:
    return [f"s{i:04d}" for i in range(n)]


def fault_times(cell: Cell) -> list[tuple[float, str]]:
    """(time s, site) of each crash: per site a Poisson process at the cell's rate; a site that is
    down (crashed, not back yet) does not crash again. Seeded by the cell's fault key."""
    if cell.rate_per_site_h <= 0:
        return []
    seed = int.from_bytes(hashlib.sha256(repr(cell.fault_key()).encode()).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    mean_gap_s = 3600.0 / cell.rate_per_site_h
    out = []
    for name in site_names(cell.sites):
        t = 0.0
        while True:
            t += float(rng.exponential(mean_gap_s))
            if t >= cell.sim_s:
                break
            out.append((round(t, 3), name))
            t += cell.repair_s
    return sorted(out)


def cell_inputs(cell: Cell) -> tuple[Any, Scenario, SimModel]:
    names = site_names(cell.sites)
    cfg = load_config({"run_id": f"sweep-{cell.policy}", "cluster": {"sites": names},
                       "train": {"target_useful_tokens": 10 ** 13, "mode": cell.mode},
                       "recovery": {"policy": cell.policy}})
    if cell.bandwidth_kbps:
        # Only the bandwidth is capped; latency and jitter stay the config's (20 +- 2 ms). A profile
        # given as {"bandwidth_kbps": B} alone would take 0 ms for them (ground.config.partial_link_notes):
        # until 624f604 every capped cell ran without latency.
        link = cfg.wan.site_link
        capped = LinkSpec(replace(link.up, bandwidth_kbps=cell.bandwidth_kbps),
                          replace(link.down, bandwidth_kbps=cell.bandwidth_kbps))
        cfg = replace(cfg, wan=replace(cfg.wan, site_link=capped))
    scen = Scenario.build("sweep", f"Poisson crashes at {cell.rate_per_site_h:g} per site-hour ({cell.rate_evidence})")
    for t, site in fault_times(cell):
        scen = scen.crash(site, at_s=t, restart_after_s=cell.repair_s)
    # Heartbeats coalesced to one per half timeout (the core keeps only the last; a live site is never late).
    model = SimModel(heartbeat_period_ms=cfg.wan.heartbeat_timeout_ms // 2)
    return cfg, scen, model


def run_cell(cell: Cell) -> dict[str, Any]:
    """One cell's simulation and its result (a plain dict: it travels back from a worker).
    `cell_cpu_s`: the CPU seconds the cell took on its worker (what a cell costs; the only field
    that differs between two runs of the same cell)."""
    cpu0 = time.process_time()
    cfg, scen, model = cell_inputs(cell)
    res = simulate(cfg, scen, model, max_sim_s=cell.sim_s)
    return {**asdict(cell), "faults": len(scen.faults), "commits": res.commits, "epochs": res.epochs,
            "useful_tokens": res.useful_tokens, "sim_s_reached": res.sim_s,
            "goodput_tokens_per_s": res.useful_tokens / cell.sim_s, "evidence": "modeled",
            "cell_cpu_s": round(time.process_time() - cpu0, 3)}


Progress = Callable[[int, int, dict[str, Any]], None]  # (cells done, cells in all, the result just done)


def progress_line(done: int, total: int, r: dict[str, Any]) -> str:
    """One finished cell, for a long sweep's progress on stderr."""
    return (f"[{done}/{total}] {r['sites']} sites, {r['rate_per_site_h']:.3g}/site-h, "
            f"{r['bandwidth_kbps'] or 'unshaped'} KB/s, {r['mode']}, {r['policy']}, seed {r['seed']}: "
            f"{r['faults']} crashes, {r['goodput_tokens_per_s']:,.0f} tok/s ({r['cell_cpu_s']:.2f} CPU-s)")


def cells(sites: Iterable[int], rates: Iterable[float], bandwidths: Iterable[int], policies: Iterable[str],
          modes: Iterable[str], sim_s: float, repair_s: float, seed: int, seeds: int = 1,
          rate_evidence: str = "prior") -> list[Cell]:
    """Every cell, each failure rate above 0 drawn `seeds` times (seeds seed, seed+1, ...: independent
    fault schedules, the same for every policy); a fault-free cell once (no seed changes it).
    `rate_evidence`: "prior" (rates from the fleet prior) or "given" (the user's --rates)."""
    if seeds < 1:
        raise ValueError(f"seeds must be at least 1, not {seeds}")
    if rate_evidence not in RATE_EVIDENCE:
        raise ValueError(f"rate_evidence must be one of {sorted(RATE_EVIDENCE)}, not {rate_evidence!r}")
    return [Cell(n, r, b, p, m, sim_s, repair_s, seed + k, rate_evidence)
            for n, r, b, m, p in product(sites, rates, bandwidths, modes, policies)
            for k in range(seeds if r > 0 else 1)]


def run_local(todo: list[Cell], workers: int | None = None, on_done: Progress | None = None) -> list[dict[str, Any]]:
    """The cells on local worker processes (one per core by default), results in the cells' order;
    `on_done` is told of each cell as it finishes (in the order they finish)."""
    workers = workers or os.cpu_count() or 1
    if workers == 1:
        out = []
        for c in todo:
            out.append(run_cell(c))
            if on_done:
                on_done(len(out), len(todo), out[-1])
        return out
    with ProcessPoolExecutor(max_workers=workers) as ex:
        futures = [ex.submit(run_cell, c) for c in todo]
        for k, f in enumerate(as_completed(futures), 1):
            if on_done:
                on_done(k, len(todo), f.result())
        return [f.result() for f in futures]


SCHEDULER_TIMEOUT_S = 30


class SchedulerUnreachable(RuntimeError):
    """`--scheduler` names no Dask scheduler this machine can reach (nothing ran)."""


def run_dask(todo: list[Cell], scheduler: str, on_done: Progress | None = None) -> list[dict[str, Any]]:
    """The cells on an existing Dask distributed cluster (its scheduler's address), in the cells' order;
    `on_done` as in `run_local`."""
    from distributed import Client
    from distributed import as_completed as dask_completed  # imported here: local sweeps do not need it

    try:
        client = Client(scheduler, timeout=f"{SCHEDULER_TIMEOUT_S}s")
    except (OSError, TimeoutError, ValueError) as e:  # no scheduler there, or not an address Dask reads
        raise SchedulerUnreachable(f"no Dask scheduler reachable at {scheduler!r} within {SCHEDULER_TIMEOUT_S} s "
                                   f"({type(e).__name__}: {e}); start one with `dask-scheduler` and give its "
                                   "tcp://HOST:PORT") from None
    with client:
        futures = client.map(run_cell, todo, pure=False)
        for k, f in enumerate(dask_completed(futures), 1):
            if on_done:
                on_done(k, len(todo), f.result())
        return client.gather(futures)


# ------------------------------------------------------------------------------ the summary
def _baselines(results: list[dict[str, Any]]) -> dict[tuple[Any, ...], float]:
    """(sites, bandwidth, mode, policy) -> the goodput of its fault-free cell."""
    return {(r["sites"], r["bandwidth_kbps"], r["mode"], r["policy"]): r["goodput_tokens_per_s"]
            for r in results if r["rate_per_site_h"] == 0}


def with_ratio(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each result with goodput_ratio: its goodput over the fault-free cell of the same sites,
    bandwidth, mode and policy (None when the sweep has no rate-0 cell)."""
    base = _baselines(results)
    out = []
    for r in results:
        b = base.get((r["sites"], r["bandwidth_kbps"], r["mode"], r["policy"]))
        out.append({**r, "goodput_ratio": (r["goodput_tokens_per_s"] / b) if b else None})
    return out


def rankings(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (sites, bandwidth, mode, rate): the policies by their mean goodput over the seeds, highest
    first (ties by name). `best`: the top policy and every policy it does not dominate (the policies
    meet the same faults per seed, so the comparison is paired; dominating: at least as good on every
    seed's schedule and better on two of them, or on the one draw of a single seed). A policy behind
    the top on the mean but ahead on one draw is not told apart from it; a draw without a crash ties
    everyone and decides nothing (`deciding_draws` counts the draws that told any policies apart).
    With one seed, `best` holds the policies of the top goodput exactly. Every policy of a group must
    have been run on the same seeds (ValueError otherwise)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["sites"], r["bandwidth_kbps"], r["mode"], r["rate_per_site_h"]), []).append(r)
    rows = []
    for (n, bw, mode, rate), rs in sorted(groups.items()):
        per: dict[str, dict[int, float]] = {}
        crashes: dict[int, int] = {}
        for r in rs:
            per.setdefault(r["policy"], {})[r["seed"]] = r["goodput_tokens_per_s"]
            crashes[r["seed"]] = r["faults"]  # the same for every policy (Cell.fault_key)
        mean = {p: sum(g.values()) / len(g) for p, g in per.items()}
        order = sorted(per, key=lambda p: (-mean[p], p))
        top = order[0]
        if len({frozenset(g) for g in per.values()}) != 1:
            raise ValueError(f"sweep results at {n} sites, {rate:g}/site-h: the policies were not run on the same "
                             f"seeds ({ {p: sorted(g) for p, g in per.items()} }): a paired ranking needs the same draws")
        seeds = sorted(crashes)
        # Draws that tell policies apart (a draw without a crash ties everyone); with several seeds the
        # top must win at least two of them to stand alone: one lucky draw is what several seeds avoid.
        deciding = sum(1 for sd in seeds if len({per[p][sd] for p in per}) > 1)
        need = min(2, len(seeds))
        best = [p for p in order if p == top or not _dominates(per[top], per[p], need)]
        rows.append({"sites": n, "bandwidth_kbps": bw, "mode": mode, "rate_per_site_h": rate,
                     "seeds": seeds, "crashes": [crashes[k] for k in seeds], "deciding_draws": deciding,
                     "ranking": order, "best": best, "goodput": {p: mean[p] for p in order},
                     "goodput_range": {p: [min(per[p].values()), max(per[p].values())] for p in order}})
    return rows


def _dominates(a: dict[int, float], b: dict[int, float], wins: int = 1) -> bool:
    """Whether goodputs `a` (seed -> tokens/s) are at least `b`'s on every seed and above on `wins` of them."""
    return all(a[k] >= b[k] for k in a) and sum(a[k] > b[k] for k in a) >= wins


def flips(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where the best policy changes: along the failure rate (same sites, bandwidth, mode) and along
    the site count (same rate, bandwidth, mode). A tie is no flip: the best sets must be disjoint."""
    out = []
    for axis, fixed in (("rate_per_site_h", ("sites", "bandwidth_kbps", "mode")),
                        ("sites", ("rate_per_site_h", "bandwidth_kbps", "mode"))):
        lines: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for r in ranks:
            lines.setdefault(tuple(r[k] for k in fixed), []).append(r)
        for key, rs in sorted(lines.items()):
            rs = sorted(rs, key=lambda r: r[axis])
            for a, b in zip(rs, rs[1:]):
                if not set(a["best"]) & set(b["best"]):
                    out.append({"along": axis, **dict(zip(fixed, key)), "from": a[axis], "to": b[axis],
                                "best_before": " ~ ".join(a["best"]), "best_after": " ~ ".join(b["best"])})
    return out


def _best_text(k: dict[str, Any]) -> str:
    """The best cell: `a ~ b` for policies not told apart; after a policy named alone over several
    draws, how many of them told any policies apart."""
    text = " ~ ".join(k["best"])
    n = len(k["seeds"])
    return text + (f" ({k['deciding_draws']} of {n} draws decide)" if len(k["best"]) == 1 and n > 1 else "")


def table_md(results: list[dict[str, Any]], ranks: list[dict[str, Any]]) -> str:
    """The rankings as a Markdown table: per policy its mean goodput (its ratio to the same cell
    without faults) and, over several seeds, the range; the crashes each seed drew."""
    policies = sorted({r["policy"] for r in results})
    base = _baselines(results)
    head = (f"| sites | KB/s | mode | failures/site-h ({rates_label(results)}) | crashes drawn | "
            + " | ".join(f"{p} tok/s (ratio)" for p in policies) + " | best |")
    lines = [head, "|" + "---|" * (6 + len(policies))]
    for k in ranks:
        cells_ = []
        for p in policies:
            g = k["goodput"].get(p)
            if g is None:
                cells_.append("-")
                continue
            b = base.get((k["sites"], k["bandwidth_kbps"], k["mode"], p))
            lo, hi = k["goodput_range"][p]
            cells_.append(f"{g:,.0f}" + (f" ({g / b:.3f})" if b else "") + (f" [{lo:,.0f}-{hi:,.0f}]" if hi > lo else ""))
        drawn = ", ".join(str(c) for c in k["crashes"])
        lines.append(f"| {k['sites']} | {k['bandwidth_kbps'] or 'unshaped'} | {k['mode']} | "
                     f"{k['rate_per_site_h']:.3g} | {drawn} | " + " | ".join(cells_) + f" | {_best_text(k)} |")
    return "\n".join(lines)


def figure(results: list[dict[str, Any]]) -> Any:
    """Goodput (tokens/s, modeled) against the failure rate, one line per policy (the mean over the
    seeds, the bars their range), one panel per (sites, bandwidth, mode)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    panels = sorted({(r["sites"], r["bandwidth_kbps"], r["mode"]) for r in results})
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[f"{n} sites, {bw or 'unshaped'} KB/s, {m}"
                                                              for n, bw, m in panels])
    policies = sorted({r["policy"] for r in results})
    dashes = ["solid", "dash", "dot", "dashdot"]
    for i, (n, bw, m) in enumerate(panels):
        for j, p in enumerate(policies):
            by_rate: dict[float, list[float]] = {}
            for r in results:
                if (r["sites"], r["bandwidth_kbps"], r["mode"], r["policy"]) == (n, bw, m, p):
                    by_rate.setdefault(r["rate_per_site_h"], []).append(r["goodput_tokens_per_s"])
            xs = sorted(by_rate)
            ys = [sum(by_rate[x]) / len(by_rate[x]) for x in xs]
            # The seeds' range around the mean (no bar where one draw was made or all agree).
            err = {"type": "data", "symmetric": False, "array": [max(by_rate[x]) - y for x, y in zip(xs, ys)],
                   "arrayminus": [y - min(by_rate[x]) for x, y in zip(xs, ys)]}
            fig.add_trace(go.Scatter(x=xs, y=ys, error_y=err, name=p, legendgroup=p, showlegend=i == 0,
                                     mode="lines+markers", line={"dash": dashes[j % len(dashes)]},
                                     marker={"symbol": j}),
                          row=i // cols + 1, col=i % cols + 1)
    fig.update_xaxes(title_text=f"failures per site-hour ({rates_label(results)})")
    fig.update_yaxes(title_text="goodput, useful tokens/s (modeled; mean and range over seeds)")
    fig.update_layout(title="Simulated goodput against the failure rate, per policy", height=320 * rows + 80)
    return fig


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    results = with_ratio(results)
    ranks = rankings(results)
    ev = rates_label(results)
    return {"evidence": "modeled",
            "failure_rates": {"evidence": ev, "source": "; ".join(RATE_EVIDENCE[e] for e in ev.split("+"))},
            "failure_prior": {**FLEET_PRIOR, "per_gpu_hour": PER_GPU_HOUR},
            "goodput": "useful tokens in the commit record per simulated second",
            "seeds_per_rate": max((len(r["seeds"]) for r in ranks if r["rate_per_site_h"] > 0), default=0),
            "best": "the policy of the highest mean goodput, and every policy it does not dominate (at least as "
                    "good on every seed's fault schedule and better on two of them, or on the one draw of a single seed: "
                    "paired draws)", "results": results,
            "rankings": ranks, "flips": flips(ranks), "table_md": table_md(results, ranks)}
