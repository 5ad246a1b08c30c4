"""summary.json: the launcher's (and `xdc summarize`'s) short account of one run.

A subset of the artifact's numbers (analysis/run_numbers.py derives both), under the keys users and
tests read, plus what only the launcher knows: the exit codes, whether the run was interrupted, and
Toxiproxy's byte counters as read live. Reads only the run directory's logs and config, never a live
process. The ledgers it reports are analysis/ledgers.py's (importable from here as before).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analysis.energy import energy_summary
from analysis.load import load_run
from analysis.run_numbers import RunNumbers, run_numbers
from ground.processes import wan_processes

# The curve's points as summary.json has always shown them (the artifact's points have these and more).
CURVE_KEYS = ("round", "useful_tokens_trained", "heldout_nll", "heldout_nll_se", "wall_ns")
WORK_TOTALS = ("attempted_tokens", "retained_tokens", "lost_tokens", "attempted_flops", "retained_flops",
               "lost_flops", "replayed_tokens")


def summary_numbers(n: RunNumbers) -> dict[str, Any]:
    """The run numbers summary.json shows, from the one derivation the artifact uses too."""
    work, front, evals, started = n.work, n.frontier, n.evals, n.site_started
    last = evals[-1] if evals else {}
    return {
        "useful_tokens": work["useful_tokens"],
        **{k: work["total"].get(k, 0) for k in WORK_TOTALS},
        "work_by_site": work["per_site"],
        "work_balanced": work["balanced"],
        "lost_units": work["lost_units"],
        "site_time": n.site_time,
        "checkpoint_tree": n.checkpoint_tree,
        "commits": work["commits"],
        "frontier_hash": front["hash"],
        "frontier_manifest_hash": front["manifest_hash"],
        "frontier_round": front["round"],
        "final_heldout_nll": last.get("heldout_nll"),
        "final_heldout_nll_se": last.get("heldout_nll_se"),
        "eval_set": last.get("eval_set"),  # sha256 of the evaluation windows
        "eval_tokens": last.get("eval_tokens"),
        "heldout_nll_curve": [{"round": e.get("round"), "useful_tokens_trained": e.get("useful_tokens_trained"),
                               "heldout_nll": e["heldout_nll"], "heldout_nll_se": e.get("heldout_nll_se"),
                               "wall_ns": e["end_wall_ns"]} for e in evals],
        "baselines": n.baselines,
        "bytes_by_class": n.bytes["by_class"],
        "bytes_by_link": n.bytes["by_link"],
        "bytes_by_link_class": n.bytes["by_link_class"],
        "proxy_bytes": n.proxy_bytes,
        "reconciliation": n.reconciliation,
        "dataset_id": started.get("dataset_id"),
        "device": started.get("device"),
        "torch": started.get("torch"),
        "n_params": started.get("n_params"),
        "flops_per_token": {"value": started.get("flops_per_token"), "evidence": "measured",
                            "source": "torch.utils.flop_counter.FlopCounterMode"},
    }


def clean_exit(sites: list[str], exit_codes: dict[str, int | None],
               earlier_exit_codes: dict[str, list[int | None]] | None, interrupted: bool) -> bool:
    """Every WAN process of the last incarnations exited 0, and no incarnation a chaos restart replaced
    exited with an error of its own (a positive status: a kill by a signal, negative, is the fault)."""
    earlier = earlier_exit_codes or {}
    return (all(exit_codes.get(p) == 0 for p in wan_processes(sites)) and not interrupted
            and not any(c is not None and c > 0 for codes in earlier.values() for c in codes))


def summarize(run_dir: Path, *, proxy_bytes: dict[str, Any], exit_codes: dict[str, int | None],
              interrupted: bool = False, earlier_exit_codes: dict[str, list[int | None]] | None = None
              ) -> dict[str, Any]:
    h = load_run(Path(run_dir))
    cfg, sites = h.config, h.sites
    return {
        "run_id": cfg["run_id"],
        "mode": cfg["train"]["mode"],
        "policy": cfg.get("recovery", {}).get("policy", "none"),
        "sites": sites,
        "target_useful_tokens": cfg["train"]["target_useful_tokens"],
        **summary_numbers(run_numbers(h, proxy_bytes)),
        "exit_codes": exit_codes,
        "earlier_exit_codes": earlier_exit_codes or {},
        "clean_exit": clean_exit(sites, exit_codes, earlier_exit_codes, interrupted),
        "interrupted": interrupted,
        "energy": energy_summary(h.run_dir),
        "config": cfg,
    }
