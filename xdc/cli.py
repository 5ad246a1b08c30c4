"""The `xdc` command line.

  xdc run  [--config FILE] [--set KEY=VALUE ...] [--quiet]   one run as local processes
  xdc demo [--set KEY=VALUE ...]                               the embedded default run
  xdc config [--config FILE] [--set ...]                       print the resolved config
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

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


def cmd_run(args: argparse.Namespace, base: dict | None = None) -> int:
    from xdc.launcher import launch

    try:
        cfg = load_config(_resolve(args, base))
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    run_dir, summary = launch(cfg, quiet=args.quiet)
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
    p_demo = sub.add_parser("demo", help="the embedded default: a three-site run over a shaped WAN")
    common(p_demo)
    p_demo.add_argument("--quiet", action="store_true")
    p_cfg = sub.add_parser("config", help="print the resolved config")
    common(p_cfg)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        return cmd_run(args)
    if args.cmd == "demo":
        return cmd_run(args, base=DEMO)
    if args.cmd == "config":
        return cmd_config(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
