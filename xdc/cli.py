"""The `xdc` command line.

  xdc run  [--config FILE] [--set KEY=VALUE ...] [--scenario FILE [--allow-unfired]] [--quiet]
                                                               one run as local processes
  xdc demo [--set KEY=VALUE ...]                               the embedded default: one outage, four
                                                               policies, then the report
  xdc chaos SCENARIO --run RUN_DIR                             drive a scenario against a live run
  xdc compare SCENARIO [--out DIR] [--set ...] [--allow-unfired]  the same scenario under all four policies

A scenario whose at_step / at_useful_tokens trigger lies past the run's target is refused (the
fault could never fire) unless --allow-unfired; a fault that did not fire is reported at the end.
  xdc config [--config FILE] [--set ...]                       print the resolved config
  xdc analyze RUN_DIR... [--out DIR]                           artifact.json + report/index.html from the logs
  xdc sql RUN_DIR... "SELECT ..."                              query the logs with DuckDB
  xdc study register|check|run|report ...                      paired, registered studies (studies/cli.py)

One process at a time (what each compose service runs; also for several hosts):
  xdc prepare --run-dir RUN --topology compose|native --toxiproxy HOST:PORT [--config/--set]
                                       write config, topology, keys; create the proxies and link profiles
  xdc store --run-dir RUN | xdc coordinator --run-dir RUN | xdc site --run-dir RUN --site a
  xdc summarize --run-dir RUN [--toxiproxy HOST:PORT]            RUN/summary.json after the run
  xdc finish --run-dir RUN [--toxiproxy HOST:PORT]               end a compose run: stop the rest, summary, report
  xdc compose generate [--out DIR] [--check]                     compose/docker-compose.yml from the topology
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

from ground.config import (ConfigError, load_config, merge, parse_override, partial_link_notes, read_config_file,
                           to_dict)
from ground.processes import compose_processes
from xdc.cli_parser import ALLOW_UNFIRED_HELP, build_parser  # noqa: F401 (ALLOW_UNFIRED_HELP: old path)


def _resolve(args: argparse.Namespace, base: dict | None = None) -> dict:
    data: dict = dict(base or {})
    if getattr(args, "config", None):
        data = merge(data, read_config_file(args.config))
    for text in getattr(args, "set", None) or []:
        data = merge(data, parse_override(text))
    if getattr(args, "runs_dir", None):
        data = merge(data, {"runs_dir": args.runs_dir})
    for note in partial_link_notes(data):
        print(f"config note: {note}", file=sys.stderr)
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
    _print_chaos(s.get("chaos"))


def _evidence_suffix(q: dict) -> str:
    """" (prior)" etc. after a number that was not measured (a simulated run's); nothing after a measured one."""
    ev = q.get("evidence")
    return "" if ev in (None, "measured") or q.get("value") is None else f" ({ev})"


def _print_chaos(chaos: dict | None) -> None:
    """The scenario's outcome: how many faults fired; every fault that did not, loudly (stderr too)."""
    if not chaos:
        return
    print(f"  faults: {len(chaos['fired'])} of {chaos['n_faults']} fired (scenario {chaos['scenario']})")
    for f in chaos["never_fired"] + chaos["failed"]:
        trig = ", ".join(f"{k}={v}" for k, v in f["trigger"].items())
        what = "NEVER FIRED" if f in chaos["never_fired"] else "FAILED TO INJECT"
        line = f"  {what}: faults[{f['index']}] {f['kind']} {f['target'] or '-'} (trigger {trig})"
        print(line)
        print(f"warning: {line.strip()}", file=sys.stderr)


from chaos.policy_config import config_for_policy  # noqa: E402
from ground.config import POLICIES  # noqa: E402


def _load_scenario(path: str, cfg: Any) -> Any:
    from chaos.scenario import load_scenario

    return load_scenario(path, sites=list(cfg.cluster.sites))


def _fits(cfg: Any, scenario: Any, args: argparse.Namespace) -> bool:
    """False (with the reason on stderr) when a fault's progress trigger lies past the target and
    the user did not pass --allow-unfired; with it, the same lines are printed as warnings."""
    from chaos.reach import ScenarioBeyondRun, check_scenario_fits

    try:
        for line in check_scenario_fits(cfg, scenario, allow_unfired=bool(getattr(args, "allow_unfired", False))):
            print(f"warning: {line}", file=sys.stderr)
    except ScenarioBeyondRun as e:
        print(f"scenario error: {e}", file=sys.stderr)
        return False
    return True


def cmd_run(args: argparse.Namespace, base: dict | None = None) -> int:
    from chaos.scenario import ScenarioError
    from cluster.launcher import launch

    try:
        cfg = load_config(_resolve(args, RECIPE if base is None else base))
        scenario = _load_scenario(args.scenario, cfg) if getattr(args, "scenario", None) else None
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except ScenarioError as e:
        print(f"scenario error: {e}", file=sys.stderr)
        return 2
    if scenario is not None:
        if not _fits(cfg, scenario, args):
            return 2
        cfg = config_for_policy(cfg, cfg.recovery.policy, scenario)
    run_dir, summary = launch(cfg, quiet=args.quiet, scenario=scenario)
    if not summary:
        print(f"run failed before it started; see {run_dir}/logs", file=sys.stderr)
        return 1
    from analysis.learning import learning_words

    _print_summary(run_dir, summary)
    print(f"  report: .venv/bin/xdc analyze {run_dir}")
    print(f"learned: {learning_words(summary.get('final_heldout_nll'), summary.get('baselines'))}")
    return 0 if summary.get("clean_exit") else 1


# The recipe that learns (issue 10; bench/results/recipe_sweep.json, docs/learning.md), the default
# of `xdc run`, `xdc compare`, `xdc prepare` (compose) and `xdc config` unless a --config or --set says otherwise:
# learning here is limited by optimizer steps, not samples, so each site takes many small steps (2 samples x
# H = 32 per round, 24,576 tokens per round over three sites) on a 2-layer model, inner AdamW 3e-3 with a
# 65,536-token warm-up and a cosine to 10 % at the target: 1,179,648 useful tokens (48 rounds) end about
# 0.5 nats below the bigram baseline in about two minutes on 2 cores (README "Quickstart"). The bare
# dataclass defaults of ground/config.py stay the small, fast settings the tests and the simulator pin.
RECIPE: dict = {
    # Sites forked from one server that imported torch once (cluster/forkserver.py): a run starts in seconds
    # and a restarted site is back in about one; compose ignores it.
    "cluster": {"fork_server": True},
    "model": {"n_layers": 2},
    "train": {"mode": "local", "target_useful_tokens": 1_179_648, "lr_warmup_tokens": 65_536,
              "per_site_batch": 2, "inner_steps_h": 32,
              "eval_every_rounds": 6, "checkpoint_every_rounds": 4},
}
# The embedded default of `xdc demo`: the recipe over a 20 ms / 5 Mbit/s WAN per link, so four policies and
# the single-process reference fit the 10-minute budget.
DEMO: dict = merge(RECIPE, {
    "wan": {"site_link": {"up": {"latency_ms": 20, "jitter_ms": 2, "bandwidth_kbps": 5000},
                          "down": {"latency_ms": 20, "jitter_ms": 2, "bandwidth_kbps": 5000}}},
})


ROOT = Path(__file__).resolve().parent.parent
DEMO_SCENARIO = ROOT / "scenarios" / "one-outage.yaml"


def cmd_compare(args: argparse.Namespace, base: dict | None = None, scenario_path: str | None = None) -> int:
    """Run one scenario under every policy; write the run directories, an index, and the report."""
    from chaos.scenario import ScenarioError
    from xdc.compare import run_comparison
    from cluster.launcher import new_run_id

    try:
        cfg = load_config(_resolve(args, DEMO if getattr(args, "demo", False) else RECIPE if base is None else base))
        scenario = _load_scenario(scenario_path or args.scenario, cfg)
    except (ConfigError, ScenarioError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not _fits(cfg, scenario, args):
        return 2
    out = Path(getattr(args, "out", None) or Path(cfg.runs_dir) / f"compare-{new_run_id()}")

    def on_run(policy: str, run_dir: Path | None = None, summary: dict | None = None) -> None:
        if run_dir is None:
            print(f"\n=== policy {policy} ===", flush=True)
        elif summary:
            _print_summary(run_dir, summary)

    index = run_comparison(cfg, scenario, out, tuple(getattr(args, "policies", None) or POLICIES),
                           quiet=args.quiet, on_run=on_run, allow_unfired=True)  # checked above
    print(f"\ncomparison: {out / 'index.json'}  matched frontier: {index['matched_frontier']}")
    ref = index.get("reference")
    if ref:
        print(f"single-process reference (same samples, no WAN): "
              + (f"final held-out NLL {ref['final_heldout_nll']:.4f} ({ref['wall_s']} s)" if "error" not in ref
                 else f"FAILED: {ref['error']}"), flush=True)
    if index["interrupted"]:
        print("interrupted: the comparison stopped early", file=sys.stderr)
        return 130
    rc = 0 if index["matched_frontier"] else 1
    if not getattr(args, "no_analyze", False):
        print("\n=== analysis ===")
        arc = cmd_analyze(argparse.Namespace(paths=[str(out)], out=None, no_report=False))
        rc = rc or arc
    return rc


def cmd_demo(args: argparse.Namespace) -> int:
    """The embedded default: the one-outage scenario under all four policies, then the report."""
    print(f"xdc demo: three sites as local processes over a Toxiproxy-shaped WAN; scenario {DEMO_SCENARIO.name} "
          "under stall, restart, elastic and oracle; then the report.", flush=True)
    return cmd_compare(args, base=DEMO, scenario_path=str(DEMO_SCENARIO))


def _chaos_run_dir(run: str) -> Path:
    """`--run` as given, or `runs/<name>` for a bare run name (`--run r1`, as compose names its runs)."""
    p = Path(run)
    if p.exists() or len(p.parts) != 1:
        return p
    return Path("runs") / run


def cmd_chaos(args: argparse.Namespace) -> int:
    import os

    from chaos.driver import wait_for_topology
    from ground.topology import COMPOSE_TOXIPROXY, COMPOSE_TOXIPROXY_API_PORT, Topology

    run_dir = _chaos_run_dir(args.run)
    # A person's terminal: the driver says each fault as it is injected and healed (ground/narrate.py).
    os.environ.setdefault("XDC_NARRATE", "1")
    # A compose run (its links' proxies are the Toxiproxy service's, by name) is driven through the
    # Docker CLI from here, with Toxiproxy's API where compose publishes it on the host's loopback.
    if not args.docker:
        if wait_for_topology(run_dir, 120.0, 0.5) is None:
            return 2
        links = Topology.load(run_dir / "topology.json").links.values()
        args.docker = bool(links) and all(link.listen.startswith(f"{COMPOSE_TOXIPROXY}:") for link in links)
    if args.docker:
        from chaos.docker_handle import main as docker_chaos_main

        api = args.toxiproxy or f"127.0.0.1:{os.environ.get('XDC_TOXIPROXY_API_PORT', COMPOSE_TOXIPROXY_API_PORT)}"
        return docker_chaos_main([args.scenario, "--run", str(run_dir), "--project", args.project, "--toxiproxy", api]
                                 + (["--dry-run"] if args.dry_run else []))
    from chaos.driver import main as chaos_main

    return chaos_main([args.scenario, "--run", str(run_dir)] + (["--dry-run"] if args.dry_run else []))


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--toxiproxy {text!r}: expected HOST:PORT, e.g. toxiproxy:8474")
    return host, int(port)


def cmd_prepare(args: argparse.Namespace) -> int:
    """Prepare a run directory for processes started by someone else (compose, several hosts)."""
    from wan.toxiproxy import ToxiproxyClient, ToxiproxyError, free_port
    from ground.eventlog import EventLog
    from cluster.launcher import provision_run_dir
    from ground.topology import plan_topology

    run_dir = Path(args.run_dir)
    try:
        data = _resolve(args, RECIPE)
        if args.sites:
            data = merge(data, {"cluster": {"sites": [s for s in args.sites.split(",") if s]}})
        data = merge(data, {"run_id": run_dir.name, "runs_dir": str(run_dir.parent)})
        cfg = load_config(data)
        host, port = _host_port(args.toxiproxy)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    sites = tuple(cfg.cluster.sites)
    if args.topology == "compose":
        plan = plan_topology(sites, "compose")
    else:
        h = cfg.cluster.host
        plan = plan_topology(sites, "native", host=h, ports={p: free_port(h) for p in plan_topology(sites).processes()})
    client = ToxiproxyClient(host, port, timeout_s=10.0)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    log = EventLog(run_dir / "logs" / "prepare.jsonl", cfg.run_id, "prepare")
    from ground.provenance import run_started_fields

    log.emit("run_started", **run_started_fields())
    from site_agent.baselines import run_baselines

    log.emit("baselines", **run_baselines(cfg))  # as the launcher does: count models on the run's eval set
    try:
        client.wait_ready(args.wait_s)
        existing = client.list_proxies()
        for name in plan.links:  # a re-run of `init` replaces the proxies of the previous one
            if name in existing:
                client.delete_proxy(name)
        topo = provision_run_dir(cfg, run_dir, plan, client, log, toxiproxy_api=f"{host}:{port}")
        if args.secret_keys_out:  # compose: each service mounts its own key alone (wan/keys.py)
            from wan.keys import deal_secret_keys
            deal_secret_keys(run_dir / "keys", args.secret_keys_out, plan.processes())
    except ToxiproxyError as e:
        print(f"toxiproxy error: {e}", file=sys.stderr)
        return 1
    finally:
        log.close()
    print(f"prepared {run_dir}: {len(topo.links)} proxies on {host}:{port}, sites {', '.join(sites)}")
    return 0


def cmd_process(args: argparse.Namespace) -> int:
    """One process of the cluster in the foreground (a compose service, or a process on another host):
    its module's main, as the launcher would start it (ground/processes.py)."""
    import importlib

    spec = next(p for p in compose_processes() if p.cli == args.cmd)
    name = args.site if spec.per_site else spec.name
    process_main = importlib.import_module(spec.module).main
    return int(process_main(["--run-dir", str(args.run_dir), *spec.args(name)]) or 0)


def cmd_summarize(args: argparse.Namespace) -> int:
    from xdc.finish import summarize_with_counters

    run_dir = Path(args.run_dir)
    if not (run_dir / "config.json").exists():
        print(f"{run_dir}/config.json not found: not a run directory", file=sys.stderr)
        return 2
    if args.toxiproxy:
        try:
            _host_port(args.toxiproxy)
        except ConfigError as e:
            print(f"config error: {e}", file=sys.stderr)
            return 2
    _print_summary(run_dir, summarize_with_counters(run_dir, args.toxiproxy))
    return 0


def cmd_finish(args: argparse.Namespace) -> int:
    import os

    from xdc.finish import finish

    run_dir = Path(args.run_dir)
    if not (run_dir / "config.json").exists():
        print(f"{run_dir}/config.json not found: not a run directory", file=sys.stderr)
        return 2
    return finish(run_dir, toxiproxy_api=args.toxiproxy, timeout_s=args.timeout_s,
                  host_runs_dir=args.host_runs_dir or os.environ.get("XDC_HOST_RUNS_DIR"),
                  out=lambda line: print(line, flush=True))


def cmd_compose(args: argparse.Namespace) -> int:
    from xdc.compose import COMPOSE_HEADER, compose_gpu_spec, compose_spec

    import yaml

    sites = tuple(s for s in args.sites.split(",") if s)
    out = Path(args.out)
    files = {"docker-compose.yml": compose_spec(sites), "docker-compose.gpu.yml": compose_gpu_spec(sites)}
    stale = []
    for name, spec in files.items():
        text = COMPOSE_HEADER + yaml.safe_dump(spec, sort_keys=False, default_flow_style=False, width=120)
        path = out / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"out of date (run `xdc compose generate`): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


def _fmt_nll(v: float | None) -> str:
    return "unavailable" if v is None else f"{v:.4f}"


def cmd_analyze(args: argparse.Namespace) -> int:
    """Logs of runs (or a comparison) -> artifact.json + report/index.html; exit 1 if a checker fails."""
    from analysis.analyze import analyze
    from analysis.load import AnalysisInputError

    try:
        res = analyze(args.paths, args.out, report=not args.no_report)
    except AnalysisInputError as e:
        print(f"analyze: {e}", file=sys.stderr)
        return 2
    art = res.artifact
    print(f"analysed {len(art['runs'])} run(s), {sum(r['n_events'] for r in art['runs']):,} events in "
          f"{res.seconds:.1f} s")
    for r in art["runs"]:
        m = r["metrics"]
        print(f"  {r['policy']:>8}: attempted {m['attempted_tokens']['value']:,} = retained "
              f"{m['retained_tokens']['value']:,} + lost {m['lost_tokens']['value']:,} tokens; frontier "
              f"{str(r['frontier']['hash'])[:12]}; final NLL {_fmt_nll(m['final_heldout_nll']['value'])}"
              + _evidence_suffix(m["final_heldout_nll"]))
    for c in art["checks"]:
        print(f"  check {c['name']:<19} {c['status']:<8} {c['summary']}")
        if c["status"] != "pass":
            for line in c["evidence"][:5]:
                print(f"      {line}")
    print(f"artifact: {res.artifact_path} (sha256 {res.artifact_sha256[:16]}…)")
    if res.report_path:
        print(f"report:   {res.report_path}  (open it in a browser; it needs no network)")
    return 1 if any(c["status"] == "fail" for c in art["checks"]) else 0


def cmd_sql(args: argparse.Namespace) -> int:
    from analysis.load import AnalysisInputError
    from analysis.sql import format_table, query

    try:
        cols, rows = query(args.paths, args.query)
    except AnalysisInputError as e:
        print(f"sql: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a DuckDB error in the user's query: say it plainly
        print(f"sql: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(format_table(cols, rows))
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(_resolve(args, RECIPE))
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(to_dict(cfg), indent=2, sort_keys=True))
    return 0




def main(argv: list[str] | None = None) -> int:
    """Run one command; output cut short by the reader (`xdc config | head`) ends quietly."""
    try:
        rc = _main(argv)
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        # The reader went away: send what is left of stdout to /dev/null so the interpreter's final
        # flush does not raise again, and exit like a well-behaved Unix filter (128 + SIGPIPE).
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _commands() -> dict[str, Callable[[argparse.Namespace], int]]:
    """Subcommand -> its function; one process command per process of the table an `xdc` command runs."""
    out: dict[str, Callable[[argparse.Namespace], int]] = {
        "prepare": cmd_prepare, "summarize": cmd_summarize, "finish": cmd_finish, "compose": cmd_compose,
        "analyze": cmd_analyze, "sql": cmd_sql, "run": cmd_run, "demo": cmd_demo, "config": cmd_config,
        "chaos": cmd_chaos, "compare": cmd_compare}
    out.update({p.cli: cmd_process for p in compose_processes()})
    return out


def _main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "noise-floor":  # its own parser (xdc/noise_floor.py), options and all
        from xdc.noise_floor import main as noise_floor_main

        return noise_floor_main(argv[1:], base=DEMO)
    if argv and argv[0] == "study":  # studies/cli.py: register | check | run | report (its own parser)
        from studies.cli import main as study_main

        return study_main(argv[1:])
    if argv and argv[0] == "publish":  # xdc/publish.py: a finished result -> results/ (its own parser)
        from xdc.publish import main as publish_main

        return publish_main(argv[1:])
    if argv and argv[0] == "report":  # xdc/results_page.py: results/ -> results/site/index.html
        from xdc.results_page import main as report_main

        return report_main(argv[1:])
    if argv and argv[0] == "sim":  # sim/cli.py: run | calibrate (its own parser)
        from sim.cli import main as sim_main

        return sim_main(argv[1:])
    args = build_parser(POLICIES).parse_args(argv)
    command = _commands().get(args.cmd)
    return command(args) if command is not None else 2


if __name__ == "__main__":
    sys.exit(main())
