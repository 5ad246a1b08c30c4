"""Shared fixtures: real cluster runs, launched once per session and reused by several tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from ground.config import load_config
from cluster.launcher import launch

ROOT = Path(__file__).resolve().parent.parent

# A small, fast workload: 12 inner steps of 3 sites x 8 samples x 128 tokens.
SMALL = {
    "train": {"per_site_batch": 8, "inner_steps_h": 4, "target_useful_tokens": 36_864, "eval_every_rounds": 1,
              "checkpoint_every_rounds": 2, "threads_per_site": 1, "device": "cpu"},
    "wan": {"site_link": {"up": {"latency_ms": 10}, "down": {"latency_ms": 10}},
            "service_link": {"up": {"latency_ms": 2}, "down": {"latency_ms": 2}}},
}


def run_cluster(tmp: Path, overrides: dict[str, Any]) -> tuple[Path, dict]:
    from ground.config import merge

    cfg = load_config(merge(merge(SMALL, overrides), {"runs_dir": str(tmp)}))
    return launch(cfg, quiet=True, timeout_s=600)


TESTS = Path(__file__).resolve().parent


def _starts_something(item: pytest.Item) -> bool:
    """tests/live_marking.py's verdict on a test: its source, its fixtures and their helpers."""
    from tests.live_marking import is_live

    fn = getattr(item, "function", None)
    if fn is None:
        return False
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs if info is not None else {}
    fixtures = [d[-1].func for name in getattr(item, "fixturenames", ()) for d in [defs.get(name)] if d]
    return is_live(fn, fixtures, item.get_closest_marker("integration") is not None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test under tests/live is marked `live` by its folder (`make test-fast` runs tests/unit). A
    test under tests/unit that starts something (tests/live_marking.py), or a test file directly in
    tests/, is a collection error that names it and says where it goes."""
    from tests.live_marking import misplaced

    problems = []
    for item in items:
        try:
            parts = item.path.resolve().relative_to(TESTS).parts
        except ValueError:
            continue  # not this suite's test
        folder = parts[0] if len(parts) > 1 else None
        if folder == "live":
            item.add_marker(pytest.mark.live)
            continue
        problem = misplaced(item.nodeid, folder, folder == "unit" and _starts_something(item))
        if problem:
            problems.append(problem)
    if problems:
        raise pytest.UsageError("tests in the wrong folder (tests/live_marking.py):\n" + "\n".join(problems))


@pytest.fixture(scope="session")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """Three sites, DiLoCo local mode (H=4), 3 outer rounds, 10 ms latency each way."""
    return run_cluster(tmp_path_factory.mktemp("local"), {"train": {"mode": "local"}})


@pytest.fixture(scope="session")
def sync_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """Three sites, sync mode, 12 steps over the same samples as local_run."""
    return run_cluster(tmp_path_factory.mktemp("sync"), {"train": {"mode": "sync"}})


# The four-policy comparison the recovery-policy and analysis tests share: site b is SIGKILLed
# after the third round commits and restarted 2 s later.
# 3 sites x 8 samples x 4 inner steps = 96 samples = 12,288 tokens per round; 8 rounds.
COMPARE_CFG = {
    "train": {"mode": "local", "per_site_batch": 8, "inner_steps_h": 4, "target_useful_tokens": 98_304,
              "eval_every_rounds": 2, "checkpoint_every_rounds": 2, "threads_per_site": 1, "device": "cpu"},
    "wan": {"site_link": {"up": {"latency_ms": 5}, "down": {"latency_ms": 5}}, "heartbeat_timeout_ms": 2000},
}


@pytest.fixture(scope="session")
def comparison(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """`xdc compare` of one outage under stall, restart, elastic and oracle: (directory, index)."""
    from chaos.scenario import Scenario
    from xdc.compare import run_comparison
    from ground.config import merge

    scenario = Scenario.build("test-one-outage", "b is killed after round 2 commits and restarted 2 s later").crash(
        "b", at_useful_tokens=36_864, restart_after_s=2)
    out = tmp_path_factory.mktemp("compare")
    cfg = load_config(merge(COMPARE_CFG, {"runs_dir": str(out)}))
    index = run_comparison(cfg, scenario, out, timeout_s=600)
    assert len(index["runs"]) == 4 and not index["interrupted"], index
    return out, index


@pytest.fixture
def toxiproxy(tmp_path: Path) -> Iterator[Any]:
    """A real toxiproxy-server on loopback for one test (its client); stopped afterwards."""
    from wan.toxiproxy import ToxiproxyServer

    server = ToxiproxyServer(log_path=tmp_path / "toxiproxy.out")
    client = server.start()
    try:
        yield client
    finally:
        server.stop()


def policy_runs(index: dict) -> dict[str, tuple[Path, dict]]:
    """policy -> (run directory, summary) of an `xdc compare` index."""
    return {r["policy"]: (Path(r["run_dir"]), json.loads((Path(r["run_dir"]) / "summary.json").read_text()))
            for r in index["runs"]}


def compare_policies(cfg: Any, scenario: Any, out: Path) -> dict[str, tuple[Path, dict]]:
    """`xdc compare` of `scenario` under all four policies (no reference run): `policy_runs` of it."""
    from xdc.compare import run_comparison

    index = run_comparison(cfg, scenario, out, timeout_s=600, reference=False)
    assert len(index["runs"]) == 4 and not index["interrupted"], index
    return policy_runs(index)


def pid_alive(pid: int) -> bool:
    """True while a process with this pid exists (signal 0: nothing is sent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def events(run_dir: Path, process: str) -> list[dict]:
    path = run_dir / "logs" / f"{process}.jsonl"
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


# The settings a live-cluster test starts from: the small, fast dataclass defaults of ground/config.py, not
# the recipe `xdc run` defaults to (xdc.cli.RECIPE: 1,179,648 tokens, about two minutes); a test's own
# --set options come after these and win.
SMALL_RUN_SETS = ["model.n_layers=4", "train.per_site_batch=8", "train.inner_steps_h=8",
                  "train.lr_warmup_tokens=8192", "train.eval_every_rounds=4", "train.checkpoint_every_rounds=8",
                  "train.target_useful_tokens=65536"]


class BackgroundRun:
    """`xdc run` as a real subprocess, for tests that act on a live cluster."""

    def __init__(self, runs_dir: Path, sets: list[str]) -> None:
        self.runs_dir = runs_dir
        cmd = [sys.executable, "-m", "xdc.cli", "run", "--quiet", "--runs-dir", str(runs_dir)]
        for s in [*SMALL_RUN_SETS, *sets]:
            cmd += ["--set", s]
        self.out = open(runs_dir / "launcher.out", "wb")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.out, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, PYTHONPATH=str(ROOT)))

    @property
    def run_dir(self) -> Path:
        return (self.runs_dir / "latest").resolve()

    def wait_for_event(self, process: str, name: str, timeout_s: float = 120) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"run ended (rc {self.proc.returncode}) before {process} logged {name}")
            try:
                for e in events(self.run_dir, process):
                    if e["event"] == name:
                        return e
            except (FileNotFoundError, json.JSONDecodeError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"{process} did not log {name} within {timeout_s} s")

    def wait(self, timeout_s: float = 300) -> int:
        try:
            return self.proc.wait(timeout_s)
        finally:
            self.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.out.close()


@pytest.fixture
def background_run(tmp_path: Path) -> Iterator[Any]:
    runs: list[BackgroundRun] = []

    def start(sets: list[str]) -> BackgroundRun:
        r = BackgroundRun(tmp_path, sets)
        runs.append(r)
        return r

    yield start
    for r in runs:
        r.stop()


def independent_ledger(run_dir: Path) -> dict[str, tuple[int, int, int]]:
    """site -> (tokens its own log says it attempted, tokens the coordinator's commit lineage records
    it contributed, tokens of its logged attempts whose round the lineage did not commit with it).

    Three numbers from two independent sources (the site's `work_attempted` events and the
    coordinator's `commit` record), so `attempted == retained + lost` is a real check, unlike a
    summary that derives one of them from the others."""
    commits = [e for e in events(run_dir, "coord") if e["event"] == "commit"]
    assert commits, f"{run_dir}: the coordinator logged no commit"
    by_id = {c["commit_id"]: c for c in commits}
    chain, cur = [], commits[-1]
    while cur is not None:
        chain.append(cur)
        cur = by_id.get(cur["parent"]) if cur["parent"] else None
    out = {}
    for site in json.loads((run_dir / "config.json").read_text())["cluster"]["sites"]:
        work, where = [], {}
        for e in events(run_dir, site):
            if e["event"] == "work_attempted":
                where[(e.get("pid"), e["epoch"], e["round"], e["inner_step"])] = len(work)
                work.append(e)
            elif e["event"] == "work_carried":  # a survivor kept this step: it counts under the new epoch
                i = where.get((e.get("pid"), e["from_epoch"], e["round"], e["inner_step"]))
                if i is not None:
                    work[i] = {**work[i], "epoch": e["epoch"]}
                    where[(e.get("pid"), e["epoch"], e["round"], e["inner_step"])] = i
        kept = {(c["epoch"], c["round"]) for c in chain if site in c["members"]}
        out[site] = (sum(e["tokens"] for e in work), sum(int(c["tokens"].get(site, 0)) for c in chain),
                     sum(e["tokens"] for e in work if (e["epoch"], e["round"]) not in kept))
    return out


def assert_ledger_balanced(run_dir: Path, summary: dict | None = None) -> dict[str, tuple[int, int, int]]:
    """attempted = retained + lost per site across independent sources; the summary agrees with them."""
    ledger = independent_ledger(run_dir)
    for site, (attempted, retained, lost) in ledger.items():
        assert attempted == retained + lost, (run_dir.name, site, attempted, retained, lost)
    if summary is not None:
        assert summary["attempted_tokens"] == sum(v[0] for v in ledger.values()), (summary["attempted_tokens"], ledger)
        assert summary["retained_tokens"] == sum(v[1] for v in ledger.values()), (summary["retained_tokens"], ledger)
        assert summary["lost_tokens"] == sum(v[2] for v in ledger.values()), (summary["lost_tokens"], ledger)
    return ledger
