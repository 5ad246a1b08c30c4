"""Loading a run's history for analysis: its JSON-lines logs and its manifests, nothing else.

A run directory holds `config.json` (the resolved config), `topology.json`, optionally
`scenario.json`, and `logs/<process>.jsonl` (one per process). `load_run` reads them into a
`RunHistory`; it never talks to a live process. The events' wall stamps are put on the run's
steady time axis (analysis/clock.py: the monotonic clock anchored to the wall clock at the run's
first event), so a step of the host's wall clock moves no timeline. A comparison directory (what
`xdc compare` writes) holds several run directories and an `index.json`; `expand_inputs` turns the
paths a user gives into the run directories to analyse.

Malformed lines are not silently dropped: a torn *last* line (a process killed mid-write) is
expected and noted; any other unreadable line is recorded with its file and line number, and
the log-integrity checker reports it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.clock import RunClock, to_steady_axis
from ground.eventlog import _loads  # noqa: F401 (bench/analysis_speed.py times it from here)
from ground.eventlog import BadLine, parse_events
from ground.events import envelope_problem


class AnalysisInputError(ValueError):
    """A path given to `xdc analyze` / `xdc sql` is not a run or comparison directory."""


@dataclass
class RunHistory:
    run_dir: Path
    config: dict[str, Any]
    topology: dict[str, Any]
    scenario: dict[str, Any] | None
    logs: dict[str, list[dict[str, Any]]]  # process name -> events in file order
    bad_lines: list[BadLine] = field(default_factory=list)
    input_hashes: dict[str, str] = field(default_factory=dict)  # relative path -> sha256
    # The time axis of the events' wall stamps (analysis/clock.py); the default: as logged.
    clock: RunClock = field(default_factory=lambda: RunClock(False, None, 0))

    @property
    def run_id(self) -> str:
        return str(self.config.get("run_id", self.run_dir.name))

    @property
    def sites(self) -> list[str]:
        return list(self.config.get("cluster", {}).get("sites", []))

    @property
    def policy(self) -> str:
        return str(self.config.get("recovery", {}).get("policy", "none"))

    _index: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict, repr=False)

    def events(self, process: str, name: str | None = None) -> list[dict[str, Any]]:
        """A process's events, or only those named `name` (indexed on first use: one pass per process)."""
        evs = self.logs.get(process, [])
        if name is None:
            return evs
        idx = self._index.get(process)
        if idx is None:
            idx = {}
            for e in evs:
                idx.setdefault(e["event"], []).append(e)
            self._index[process] = idx
        return idx.get(name, [])

    def attempts(self, site: str) -> list[dict[str, Any]]:
        """The site's `work_attempted` events, each under the epoch that used it (a `work_carried`
        moves one: analysis.ledgers.credited_attempts)."""
        if not self.events(site, "work_carried"):
            return self.events(site, "work_attempted")
        from analysis.ledgers import credited_attempts
        return credited_attempts([e for e in self.events(site) if e["event"] in ("work_attempted", "work_carried")])

    def n_events(self) -> int:
        return sum(len(v) for v in self.logs.values())


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], list[BadLine], str]:
    """Events of one log, its unreadable lines, and the sha256 of its bytes."""
    data = path.read_bytes()
    # A malformed envelope (a string mono_ns, a span without its end) is a bad line, out of the
    # history: every ledger sorts and subtracts those fields, and log_integrity names the line.
    events, bad = parse_events(data, str(path), problem=envelope_problem)
    return events, bad, hashlib.sha256(data).hexdigest()


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise AnalysisInputError(f"{path}: missing ({what})") from None
    except json.JSONDecodeError as e:
        raise AnalysisInputError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({what}): {e.msg}") from None


def _check_config(path: Path, config: Any) -> dict[str, Any]:
    """The sections every analysis reads (the sites, the model, the training recipe): a config.json
    without them is not one xdc wrote (hand-made or truncated), and is refused by name, not met
    later as a KeyError deep in a ledger."""
    if not isinstance(config, dict):
        raise AnalysisInputError(f"{path}: the run's resolved config is a JSON {type(config).__name__}, not an object")
    missing = [k for k in ("model", "train") if not isinstance(config.get(k), dict)]
    cluster = config.get("cluster")
    sites = cluster.get("sites") if isinstance(cluster, dict) else None
    if not (isinstance(sites, list) and sites and all(isinstance(s, str) for s in sites)):
        missing.append("cluster.sites (a list of site names)")
    if missing:
        raise AnalysisInputError(f"{path}: the run's resolved config has no {', '.join(missing)}; "
                                 f"xdc writes every section, so this config.json was made or cut by hand")
    # The numbers the ledgers count by: integers (the sample length above 0), or the config is not xdc's.
    for section, key, least in (("model", "seq_len", 1), ("train", "target_useful_tokens", 0)):
        v = config[section].get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < least):
            raise AnalysisInputError(f"{path}: the run's resolved config has {section}.{key} = {v!r}, "
                                     f"not an integer >= {least}")
    return config


def _check_topology(path: Path, topology: Any) -> dict[str, Any]:
    if not isinstance(topology, dict):
        raise AnalysisInputError(f"{path}: the run's topology is a JSON {type(topology).__name__}, not an object")
    return topology


def _check_scenario(path: Path, scenario: Any) -> dict[str, Any]:
    """A scenario.json the chaos driver wrote: an object whose `faults` (if any) is a list of objects.
    Anything else is refused: read as no scenario, it would make the faults checker say none was due."""
    if not isinstance(scenario, dict):
        raise AnalysisInputError(f"{path}: the run's scenario is a JSON {type(scenario).__name__}, not an object")
    faults = scenario.get("faults", [])
    if not isinstance(faults, list) or not all(isinstance(f, dict) for f in faults):
        raise AnalysisInputError(f"{path}: the scenario's 'faults' must be a list of objects, got "
                                 f"{type(faults).__name__ if not isinstance(faults, list) else 'a list holding a non-object'}")
    return scenario


def load_run(run_dir: Path) -> RunHistory:
    run_dir = Path(run_dir)
    if not (run_dir / "logs").is_dir():
        raise AnalysisInputError(f"{run_dir}: no logs/ directory, so not a run directory")
    hashes: dict[str, str] = {}
    config = _check_config(run_dir / "config.json", _read_json(run_dir / "config.json", "the run's resolved config"))
    topo_path = run_dir / "topology.json"
    topology = _check_topology(topo_path, _read_json(topo_path, "the run's topology")) if topo_path.exists() else {}
    scen_path = run_dir / "scenario.json"
    scenario = _check_scenario(scen_path, _read_json(scen_path, "the run's scenario")) if scen_path.exists() else None
    for p in (run_dir / "config.json", topo_path, scen_path):
        if p.exists():
            hashes[p.name] = hashlib.sha256(p.read_bytes()).hexdigest()
    logs: dict[str, list[dict[str, Any]]] = {}
    bad: list[BadLine] = []
    for p in sorted((run_dir / "logs").glob("*.jsonl")):
        evs, b, digest = read_jsonl(p)
        logs[p.stem] = evs
        bad.extend(b)
        hashes[f"logs/{p.name}"] = digest
    if not logs:
        raise AnalysisInputError(f"{run_dir}/logs: no *.jsonl logs")
    clock = to_steady_axis(logs)  # every timeline on one axis no wall-clock step moves
    return RunHistory(run_dir, config, topology, scenario, logs, bad, hashes, clock)


def is_run_dir(p: Path) -> bool:
    return (p / "config.json").is_file() and (p / "logs").is_dir()


def expand_inputs(paths: list[str | Path]) -> tuple[list[Path], dict[str, Any] | None, Path | None]:
    """Run directories to analyse, the comparison index if one was given, and its directory.

    Accepts run directories, a comparison directory (with index.json), or `runs/latest`.
    """
    runs: list[Path] = []
    index: dict[str, Any] | None = None
    cmp_dir: Path | None = None
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise AnalysisInputError(f"{p}: no such directory")
        p = p.resolve()
        if is_run_dir(p):
            runs.append(p)
        elif (p / "index.json").is_file():
            index = _read_json(p / "index.json", "a comparison index")
            cmp_dir = p
            for r in index.get("runs", []):
                rd = Path(r["run_dir"])
                if not rd.is_absolute() or not rd.exists():
                    rd = p / Path(r["run_dir"]).name  # the comparison was moved: runs sit beside index.json
                if not is_run_dir(rd):
                    raise AnalysisInputError(f"{p}/index.json names {r['run_dir']}, which is not a run directory")
                runs.append(rd)
        else:
            raise AnalysisInputError(f"{p}: neither a run directory (config.json + logs/) nor a comparison "
                                     "(index.json from `xdc compare`)")
    if not runs:
        raise AnalysisInputError("no run directories given")
    return runs, index, cmp_dir
