"""One scenario under several recovery policies: four run directories and an index.

`run_comparison` is what `xdc compare` and `xdc demo` run; the tests use it too, so the index
they analyse is the one a user gets.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from xdc.config import RunConfig

POLICIES = ("stall", "restart", "elastic", "oracle")


def oracle_faults(scenario: Any) -> list[list[Any]]:
    """(site, useful tokens) of every site fault the oracle can see coming (progress triggers only)."""
    out = []
    for f in scenario.faults:
        tokens = getattr(f.trigger, "at_useful_tokens", None)
        if f.kind in ("site_crash", "site_preempt", "site_hang", "site_restart") and tokens is not None:
            out.append([f.target, int(tokens)])
    return out


def with_policy(cfg: RunConfig, policy: str, scenario: Any) -> RunConfig:
    faults = tuple((s, t) for s, t in oracle_faults(scenario)) if (scenario is not None and policy == "oracle") else ()
    return replace(cfg, recovery=replace(cfg.recovery, policy=policy, oracle_faults=faults))


def run_comparison(cfg: RunConfig, scenario: Any, out: Path, policies: tuple[str, ...] | list[str] = POLICIES, *,
                   quiet: bool = True, timeout_s: float | None = None,
                   on_run: Any = None) -> dict[str, Any]:
    """Run every policy in turn; write out/index.json. Stops early (index["interrupted"]) on Ctrl-C."""
    from xdc.launcher import launch, new_run_id

    out.mkdir(parents=True, exist_ok=True)
    index: dict[str, Any] = {"scenario": scenario.to_dict(), "runs": [], "interrupted": False}
    for policy in policies:
        pcfg = with_policy(replace(cfg, runs_dir=str(out), run_id=f"{policy}-{new_run_id()}"), policy, scenario)
        if on_run is not None:
            on_run(policy)
        kw = {"timeout_s": timeout_s} if timeout_s is not None else {}
        run_dir, summary = launch(pcfg, quiet=quiet, scenario=scenario, **kw)
        if on_run is not None:
            on_run(policy, run_dir, summary)
        if not summary or summary.get("interrupted"):
            index["interrupted"] = True
            break
        index["runs"].append({"policy": policy, "run_dir": str(Path(run_dir).resolve()),
                              **{k: summary.get(k) for k in ("useful_tokens", "attempted_tokens", "retained_tokens",
                                                             "lost_tokens", "frontier_hash", "final_heldout_nll",
                                                             "work_balanced")}})
    hashes = {r["frontier_hash"] for r in index["runs"]}
    index["matched_frontier"] = bool(index["runs"]) and len(hashes) == 1 and None not in hashes
    (out / "index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
    return index
