"""The `xdc` command line's parser (xdc/cli.py dispatches what it parses). The `study` and
`noise-floor` subcommands have parsers of their own and are listed here only for --help."""

from __future__ import annotations

import argparse
from pathlib import Path

from ground.processes import compose_processes

ALLOW_UNFIRED_HELP = ("run a scenario even if a fault's at_step / at_useful_tokens trigger lies past the run's "
                      "target (that fault cannot fire; it is reported as never fired)")


def common(p: argparse.ArgumentParser) -> None:
    """The options every command that resolves a run config takes."""
    p.add_argument("--config", help="YAML or JSON run config (see `xdc config` for every field)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override, e.g. train.mode=sync")
    p.add_argument("--runs-dir", help="where run directories go (default: runs)")


def _cluster_commands(sub: argparse._SubParsersAction, policies: tuple[str, ...]) -> None:
    """run, demo, chaos, compare, study, noise-floor, config: whole clusters and what drives them."""
    p_run = sub.add_parser("run", help="run a three-site cluster as local processes")
    common(p_run)
    p_run.add_argument("--quiet", action="store_true", help="no live display")
    p_run.add_argument("--scenario", help="a chaos scenario file (scenarios/*.yaml) to run against the cluster")
    p_run.add_argument("--allow-unfired", action="store_true", help=ALLOW_UNFIRED_HELP)
    p_demo = sub.add_parser("demo", help="the embedded default: one outage under all four recovery policies, "
                                         "then the report")
    common(p_demo)
    p_demo.add_argument("--quiet", action="store_true")
    p_demo.add_argument("--out", help="directory for the four runs, index.json and the report")
    p_chaos = sub.add_parser("chaos", help="drive a chaos scenario against a live run")
    p_chaos.add_argument("scenario")
    p_chaos.add_argument("--run", required=True, help="the run directory of a live cluster (a bare name: runs/NAME); "
                                                       "a compose run is recognised by its topology")
    p_chaos.add_argument("--dry-run", action="store_true")
    p_chaos.add_argument("--docker", action="store_true",
                         help="the cluster is a docker compose project (faults through the docker CLI; "
                              "implied by a compose run's topology)")
    p_chaos.add_argument("--project", default="xdc", help="with --docker: the compose project name (default xdc)")
    p_chaos.add_argument("--toxiproxy", help="with --docker: Toxiproxy API HOST:PORT as seen from here "
                                             "(default: 127.0.0.1:$XDC_TOXIPROXY_API_PORT or 8474, where compose publishes it)")
    p_cmp = sub.add_parser("compare", help="run one scenario under all four recovery policies")
    common(p_cmp)
    p_cmp.add_argument("scenario")
    p_cmp.add_argument("--out", help="directory for the four runs and index.json")
    p_cmp.add_argument("--policy", dest="policies", action="append", choices=policies,
                       help="only these policies (repeatable); default all four")
    p_cmp.add_argument("--demo", action="store_true", help="start from the demo preset")
    p_cmp.add_argument("--quiet", action="store_true")
    p_cmp.add_argument("--no-analyze", action="store_true", help="skip `xdc analyze` of the comparison")
    p_cmp.add_argument("--allow-unfired", action="store_true", help=ALLOW_UNFIRED_HELP)
    sub.add_parser("study", help="paired, registered studies (handled before this parser: see xdc study --help)")
    sub.add_parser("noise-floor", help="seed-to-seed spread of the final NLL, from real runs (handled before "
                                       "this parser: see xdc noise-floor --help)")
    sub.add_parser("sim", help="the discrete-event simulator: run | calibrate (handled before this parser: "
                               "see xdc sim --help)")
    sub.add_parser("publish", help="copy a finished comparison, study or simulator report into results/ "
                                   "(handled before this parser: see xdc publish --help)")
    sub.add_parser("report", help="the published page results/site/index.html from results/ alone (handled "
                                  "before this parser: see xdc report --help)")
    p_cfg = sub.add_parser("config", help="print the resolved config")
    common(p_cfg)


def _process_commands(sub: argparse._SubParsersAction) -> None:
    """prepare, one command per process, sampler: a cluster started by hand or by compose."""
    p_prep = sub.add_parser("prepare", help="prepare a run directory and the proxies for separately started processes")
    common(p_prep)
    p_prep.add_argument("--run-dir", required=True, help="the run directory (its name is the run id)")
    p_prep.add_argument("--topology", choices=("compose", "native"), default="compose")
    p_prep.add_argument("--toxiproxy", required=True, metavar="HOST:PORT", help="Toxiproxy's API")
    p_prep.add_argument("--sites", help="comma-separated site names (default: the config's cluster.sites)")
    p_prep.add_argument("--wait-s", type=float, default=30.0, help="how long to wait for Toxiproxy")
    p_prep.add_argument("--secret-keys-out", metavar="DIR",
                        help="move each process's secret key to DIR/<process>/, out of the run directory")
    for proc in compose_processes():  # one command per process of the table an `xdc` command runs
        # `sampler` beside a hand-started cluster: start it first, stop it last with Ctrl-C
        p = sub.add_parser(proc.cli, help=f"run {'one' if proc.per_site else 'the'} {proc.role} in the foreground")
        p.add_argument("--run-dir", required=True, help="a prepared run directory")
        if proc.per_site:
            p.add_argument("--site", required=True)


def _analysis_commands(sub: argparse._SubParsersAction) -> None:
    """summarize, analyze, sql, compose generate: after a run, and the compose files."""
    p_sum = sub.add_parser("summarize", help="write RUN/summary.json from the logs of a finished run")
    p_sum.add_argument("--run-dir", required=True)
    p_sum.add_argument("--toxiproxy", metavar="HOST:PORT", help="read Toxiproxy's byte counters from this API")
    p_fin = sub.add_parser("finish", help="end a compose run: wait for the coordinator, stop the rest, "
                                          "summary, artifact and report (the `finish` service)")
    p_fin.add_argument("--run-dir", required=True)
    p_fin.add_argument("--toxiproxy", metavar="HOST:PORT", help="read Toxiproxy's byte counters from this API")
    p_fin.add_argument("--host-runs-dir", default=None,
                       help="where the runs directory is on the host (for the printed paths; default $XDC_HOST_RUNS_DIR)")
    p_fin.add_argument("--timeout-s", type=float, default=7200.0, help="give up waiting for the run after this long")
    p_an = sub.add_parser("analyze", help="logs of runs or a comparison -> artifact.json + report/index.html")
    p_an.add_argument("paths", nargs="+", help="run directories, or a comparison directory (from xdc compare)")
    p_an.add_argument("--out", help="output directory (default: the comparison or run directory)")
    p_an.add_argument("--no-report", action="store_true", help="only artifact.json")
    p_sql = sub.add_parser("sql", help="query the runs' JSON-lines logs with DuckDB (views: events, commits, "
                                       "work, spans)")
    p_sql.add_argument("paths", nargs="+", help="run or comparison directories, then the query", metavar="PATH")
    p_sql.add_argument("query", help="SQL, e.g. \"SELECT event, count(*) FROM events GROUP BY event\"")
    p_comp = sub.add_parser("compose", help="the docker compose files, generated from the topology")
    comp_sub = p_comp.add_subparsers(dest="compose_cmd", required=True)
    p_gen = comp_sub.add_parser("generate", help="write compose/docker-compose.yml (+ .gpu.yml)")
    p_gen.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "compose"))
    p_gen.add_argument("--sites", default="a,b,c")
    p_gen.add_argument("--check", action="store_true", help="only check the files are up to date")


def build_parser(policies: tuple[str, ...]) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="xdc", description="A cross-datacenter training emulator.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    _cluster_commands(sub, policies)
    _process_commands(sub)
    _analysis_commands(sub)
    return ap
