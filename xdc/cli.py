"""The `xdc` command line.

  xdc run  [--config FILE] [--set KEY=VALUE ...] [--scenario FILE] [--quiet]   one run as local processes
  xdc demo [--set KEY=VALUE ...]                               the embedded default run
  xdc chaos SCENARIO --run RUN_DIR                             drive a scenario against a live run
  xdc compare SCENARIO [--out DIR] [--set ...]                 the same scenario under all four policies
  xdc config [--config FILE] [--set ...]                       print the resolved config
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from xdc.config import ConfigError, load_config, merge, parse_override, read_config_file, to_dict


def _resolve(args: argparse.Namespace, base: dict | None = None) -> dict:
    data: dict = dict(base or {})
    if getattr(args, "config", None):
        data = merge(data, read_config_file(args.config))
    for text in getattr(args, "set", None) or []:
        data = merge(data, parse_override(text))
    if getattr(args, "runs_dir", None):
        data = merge(data, {"runs_dir": args.runs_dir})
    return data


def _print_summary(run_dir: Path, s: dict) -> None:
    rec = s.get("reconciliation", {})
    print(f"\nrun directory: {run_dir}")
    print(f"  mode={s['mode']}  useful tokens={s['useful_tokens']:,} (target {s['target_useful_tokens']:,})")
    print(f"  attempted={s['attempted_tokens']:,} = retained {s['retained_tokens']:,} + lost {s['lost_tokens']:,}"
          f"  balanced={s['work_balanced']}")
    nll = s.get("final_heldout_nll")
    curve = s.get("heldout_nll_curve", [])
    first = curve[0]["heldout_nll"] if curve else None
    print(f"  held-out NLL: {first if first is None else round(first, 4)} -> {nll if nll is None else round(nll, 4)}"
          " nats/token")
    print("  inter-site bytes by class: " + ", ".join(f"{k}={v:,}" for k, v in s["bytes_by_class"].items()))
    if rec.get("evidence") == "measured":
        print(f"  Toxiproxy counted {rec['proxy_total']:,} B; classes sum to {rec['counted_total']:,} B; "
              f"framing overhead {rec['overhead_bytes']:,} B ({100 * rec['overhead_fraction']:.2f}%)")
    print(f"  frontier: round {s['frontier_round']}  hash {s['frontier_hash']}")
    print(f"  exit codes: {s['exit_codes']}  clean={s['clean_exit']}")


POLICIES = ("stall", "restart", "elastic", "oracle")


def _load_scenario(path: str, cfg: Any) -> Any:
    from chaos.scenario import load_scenario

    return load_scenario(path, sites=list(cfg.cluster.sites))


def oracle_faults(scenario: Any) -> list[list[Any]]:
    """(site, useful tokens) of every site fault the oracle can see coming (progress triggers only)."""
    out = []
    for f in scenario.faults:
        tokens = getattr(f.trigger, "at_useful_tokens", None)
        if f.kind in ("site_crash", "site_preempt", "site_hang", "site_restart") and tokens is not None:
            out.append([f.target, int(tokens)])
    return out


def _with_policy(cfg: Any, policy: str, scenario: Any) -> Any:
    from dataclasses import replace

    faults = tuple((s, t) for s, t in oracle_faults(scenario)) if (scenario is not None and policy == "oracle") else ()
    return replace(cfg, recovery=replace(cfg.recovery, policy=policy, oracle_faults=faults))


def cmd_run(args: argparse.Namespace, base: dict | None = None) -> int:
    from chaos.scenario import ScenarioError
    from xdc.launcher import launch

    try:
        cfg = load_config(_resolve(args, base))
        scenario = _load_scenario(args.scenario, cfg) if getattr(args, "scenario", None) else None
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except ScenarioError as e:
        print(f"scenario error: {e}", file=sys.stderr)
        return 2
    if scenario is not None:
        cfg = _with_policy(cfg, cfg.recovery.policy, scenario)
    run_dir, summary = launch(cfg, quiet=args.quiet, scenario=scenario)
    if not summary:
        print(f"run failed before it started; see {run_dir}/logs", file=sys.stderr)
        return 1
    _print_summary(run_dir, summary)
    return 0 if summary.get("clean_exit") else 1


# The embedded default of `xdc demo`: three sites, DiLoCo (H=8), a 20 ms / 40 Mbit/s WAN per link,
# 262,144 useful tokens (about a minute on a 2-core laptop CPU).
DEMO: dict = {
    "train": {"mode": "local", "target_useful_tokens": 262_144, "eval_every_rounds": 2, "checkpoint_every_rounds": 4},
    "wan": {"site_link": {"up": {"latency_ms": 20, "jitter_ms": 2, "bandwidth_kbps": 5000},
                          "down": {"latency_ms": 20, "jitter_ms": 2, "bandwidth_kbps": 5000}}},
}


def cmd_compare(args: argparse.Namespace) -> int:
    """Run one scenario under every policy; write the four run directories and an index."""
    from dataclasses import replace

    from chaos.scenario import ScenarioError
    from xdc.launcher import launch, new_run_id

    try:
        cfg = load_config(_resolve(args, DEMO if args.demo else None))
        scenario = _load_scenario(args.scenario, cfg)
    except (ConfigError, ScenarioError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out or Path(cfg.runs_dir) / f"compare-{new_run_id()}")
    out.mkdir(parents=True, exist_ok=True)
    index: dict[str, Any] = {"scenario": scenario.to_dict(), "runs": []}
    for policy in args.policies or POLICIES:
        pcfg = _with_policy(replace(cfg, runs_dir=str(out), run_id=f"{policy}-{new_run_id()}"), policy, scenario)
        print(f"\n=== policy {policy} ===")
        run_dir, summary = launch(pcfg, quiet=args.quiet, scenario=scenario)
        if summary:
            _print_summary(run_dir, summary)
        if not summary or summary.get("interrupted"):
            print("interrupted: the comparison stops here", file=sys.stderr)
            return 130
        index["runs"].append({"policy": policy, "run_dir": str(run_dir.resolve()),
                              **{k: summary.get(k) for k in ("useful_tokens", "attempted_tokens", "retained_tokens",
                                                             "lost_tokens", "frontier_hash", "final_heldout_nll",
                                                             "work_balanced")}})
    hashes = {r["frontier_hash"] for r in index["runs"]}
    index["matched_frontier"] = len(hashes) == 1 and None not in hashes
    (out / "index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
    print(f"\ncomparison: {out / 'index.json'}  matched frontier: {index['matched_frontier']}")
    return 0 if index["matched_frontier"] else 1


def cmd_chaos(args: argparse.Namespace) -> int:
    from chaos.driver import main as chaos_main

    return chaos_main([args.scenario, "--run", args.run] + (["--dry-run"] if args.dry_run else []))


def cmd_config(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(_resolve(args))
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(to_dict(cfg), indent=2, sort_keys=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="xdc", description="A cross-datacenter training emulator.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", help="YAML or JSON run config (see `xdc config` for every field)")
        p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override, e.g. train.mode=sync")
        p.add_argument("--runs-dir", help="where run directories go (default: runs)")

    p_run = sub.add_parser("run", help="run a three-site cluster as local processes")
    common(p_run)
    p_run.add_argument("--quiet", action="store_true", help="no live display")
    p_run.add_argument("--scenario", help="a chaos scenario file (scenarios/*.yaml) to run against the cluster")
    p_demo = sub.add_parser("demo", help="the embedded default: a three-site run over a shaped WAN")
    common(p_demo)
    p_demo.add_argument("--quiet", action="store_true")
    p_chaos = sub.add_parser("chaos", help="drive a chaos scenario against a live run")
    p_chaos.add_argument("scenario")
    p_chaos.add_argument("--run", required=True, help="the run directory of a live cluster")
    p_chaos.add_argument("--dry-run", action="store_true")
    p_cmp = sub.add_parser("compare", help="run one scenario under all four recovery policies")
    common(p_cmp)
    p_cmp.add_argument("scenario")
    p_cmp.add_argument("--out", help="directory for the four runs and index.json")
    p_cmp.add_argument("--policy", dest="policies", action="append", choices=POLICIES,
                       help="only these policies (repeatable); default all four")
    p_cmp.add_argument("--demo", action="store_true", help="start from the demo preset")
    p_cmp.add_argument("--quiet", action="store_true")
    p_cfg = sub.add_parser("config", help="print the resolved config")
    common(p_cfg)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        return cmd_run(args)
    if args.cmd == "demo":
        return cmd_run(args, base=DEMO)
    if args.cmd == "config":
        return cmd_config(args)
    if args.cmd == "chaos":
        return cmd_chaos(args)
    if args.cmd == "compare":
        return cmd_compare(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
