"""Shared plumbing of the benchmarks: a real Toxiproxy + real ZeroMQ (CURVE) cluster in one process,
environment capture, and the result file.

Every benchmark reports a RATIO of two things measured side by side in the same run, because the
machine is a small shared box whose absolute speed drifts. `BenchCluster` starts the real
`toxiproxy-server` binary, generates per-cluster CURVE keys in a temporary directory, creates one
proxy per directed link `<client>_to_<server>` with the requested `LinkSpec`, and builds one
`WanNode` per process (each with its own ZeroMQ context and I/O thread). Nothing is mocked: if the
binary or CURVE is missing, construction raises.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from wan.frames import TrafficClass
from wan.keys import generate_cluster_keys
from wan.node import Route, WanNode
from wan.toxiproxy import ToxiproxyServer, apply_link_spec, free_port
from ground.config import LinkSpec, WanConfig
from ground.eventlog import EventLog

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
KB = 1000  # Toxiproxy's KB
MiB = 1024 * 1024


class BenchError(RuntimeError):
    """The benchmark could not run as specified (missing binary, a link that never came up, ...)."""


class BenchCluster:
    """Toxiproxy + one WanNode per process, all in this process, loopback only.

        with BenchCluster(["a", "b"], {"a_to_b": spec}, wan) as cl:
            q = cl.nodes["b"].inbox("blob")    # register inboxes/periodic tasks first
            cl.start()                           # start I/O threads, wait until every link carries a ping
            ...

    `links` maps "<client>_to_<server>" to the spec of that proxy. A process binds a ROUTER when
    some link has it as server (or it is in `bind_extra`); it has a Route (a DEALER) for every link
    where it is the client.
    """

    def __init__(self, processes: Sequence[str], links: dict[str, LinkSpec], wan: WanConfig,
                 *, run_id: str = "bench", bind_extra: Iterable[str] = ()) -> None:
        self.processes = list(processes)
        self.links = dict(links)
        self.wan = wan
        self.run_id = run_id
        self.bind_extra = set(bind_extra)
        self.tmp: tempfile.TemporaryDirectory | None = None
        self.toxi: ToxiproxyServer | None = None
        self.client = None
        self.toxiproxy_version = "unknown"
        self.nodes: dict[str, WanNode] = {}
        self.logs: dict[str, EventLog] = {}
        self._ping_q: dict[str, queue.Queue] = {}
        self.listen: dict[str, str] = {}

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> BenchCluster:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="xdc-bench-")
        work = Path(self.tmp.name)
        host = "127.0.0.1"
        keys_dir = work / "keys"
        if self.wan.curve:
            generate_cluster_keys(keys_dir, self.processes)
        parsed = {}
        for name in self.links:
            client, sep, server = name.partition("_to_")
            if not sep or client not in self.processes or server not in self.processes:
                raise BenchError(f"link {name!r} is not <client>_to_<server> over {self.processes}")
            parsed[name] = (client, server)
        servers = {s for _c, s in parsed.values()} | self.bind_extra
        binds = {p: f"{host}:{free_port(host)}" for p in self.processes if p in servers}
        self.toxi = ToxiproxyServer(host=host, port=0, log_path=work / "toxiproxy.out")
        self.client = self.toxi.start()  # raises ToxiproxyError if the real binary cannot start
        self.toxiproxy_version = self.client.version()
        for name, (_c, s) in parsed.items():
            proxy = self.client.create_proxy(name, f"{host}:0", binds[s])
            apply_link_spec(self.client, name, self.links[name])
            self.listen[name] = proxy.listen
        for p in self.processes:
            routes = [Route(s, name, f"tcp://{self.listen[name]}") for name, (c, s) in parsed.items() if c == p]
            server_links = {c: name for name, (c, s) in parsed.items() if s == p}
            log = EventLog(work / "logs" / f"{p}.jsonl", self.run_id, p)
            self.logs[p] = log
            node = WanNode(name=p, run_id=self.run_id, wan=self.wan, log=log, routes=routes,
                           bind=f"tcp://{binds[p]}" if p in binds else None, server_links=server_links,
                           members=self.processes, keys_dir=str(keys_dir) if self.wan.curve else None)
            self._ping_q[p] = node.inbox("bench_ping")
            self.nodes[p] = node

    def start(self, timeout_s: float = 20.0) -> None:
        """Start every I/O thread, then push one reliable ping over every link and wait for all of
        them, so that TCP, the CURVE handshake and the ZAP check are done before timing starts."""
        # Servers first: a DEALER that connects before its ROUTER is bound gets its first connection reset by
        # Toxiproxy (upstream refused), reconnects and resends its unacked ping -- harmless, but it would show up
        # as retransmits/duplicates. In a full mesh some of that is unavoidable; `stats()` reports counts after
        # start() separately from those of the start-up.
        for node in sorted(self.nodes.values(), key=lambda n: (n.bind is None, len(n.routes))):
            node.start()
        expected: dict[str, set[str]] = {p: set() for p in self.processes}
        for name in self.links:
            c, _, s = name.partition("_to_")
            self.nodes[c].send(s, "bench_ping", TrafficClass.CONTROL.value, {"link": name})
            expected[s].add(c)
        deadline = time.monotonic() + timeout_s
        for p, want in expected.items():
            got: set[str] = set()
            while got != want:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BenchError(f"{p} heard pings only from {sorted(got)} of {sorted(want)} within "
                                     f"{timeout_s:g} s; links not up (see {self.tmp.name if self.tmp else '?'})")
                for n in self.nodes.values():
                    n.check()
                try:
                    got.add(self._ping_q[p].get(timeout=min(left, 0.2)).src)
                except queue.Empty:
                    pass
        for node in self.nodes.values():
            if not node.wait_acked(timeout_s):
                raise BenchError(f"{node.name}: pings not acked within {timeout_s:g} s")
        self._startup_stats = self._raw_stats()

    def close(self) -> None:
        for node in self.nodes.values():
            try:
                node.close()
            except Exception:
                pass
        for log in self.logs.values():
            log.close()
        if self.toxi is not None:
            self.toxi.stop()
        if self.tmp is not None:
            self.tmp.cleanup()
            self.tmp = None

    def _raw_stats(self) -> dict[str, dict[str, int]]:
        return {p: {"retransmits": n.retransmits, "duplicates": n.duplicates, "rejected": n.rejected}
                for p, n in self.nodes.items()}

    def stats(self) -> dict[str, Any]:
        """Retransmitted/duplicate/rejected message counts per node during the measurement (after start())
        and during start-up (connection races, see start())."""
        now = self._raw_stats()
        base = getattr(self, "_startup_stats", {p: {k: 0 for k in v} for p, v in now.items()})
        return {"after_start": {p: {k: now[p][k] - base[p][k] for k in now[p]} for p in now}, "startup": base}


# ------------------------------------------------------------------------ environment & results

def env_info(toxiproxy_version: str) -> dict[str, Any]:
    import numpy
    import torch
    import zmq

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=5).stdout.strip()
    except Exception:
        commit = ""
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
        "curve": bool(zmq.has("curve")),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "toxiproxy": toxiproxy_version,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit,
        "loadavg_at_end": load,
    }


# What a ratio's denominator is. Only `side_by_side` compares two things measured in the same run;
# the others compare one measurement with a number computed from the configuration or fixed.
REFERENCES = {
    "side_by_side": "two arms measured interleaved in the same run",
    "sequential": "arms measured one after another in the same run (not interleaved: load drift between them is not cancelled)",
    "analytic_bound": "a measurement over an ideal computed from the configured link (latency, bandwidth)",
    "fixed_goal": "a measurement over a fixed goal (seconds or a threshold from the config)",
}


def write_result(name: str, *, ratio: float, goal: str, passed: bool, raw: dict[str, Any], env: dict[str, Any],
                 notes: str, reference: str, measures: Sequence[str]) -> dict[str, Any]:
    """Write bench/results/<name>.json. `reference` is a key of REFERENCES; `measures` lists the
    repository paths whose code the number depends on (a later commit touching one makes it stale)."""
    if reference not in REFERENCES:
        raise ValueError(f"reference {reference!r} is not one of {sorted(REFERENCES)}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    env = {**env, **tree_state(measures)}
    out = {"name": name, "ratio": float(ratio), "goal": goal, "passed": bool(passed), "reference": reference,
           "measures": list(measures), "raw": raw, "env": env, "notes": notes}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(out, indent=2, sort_keys=False, default=_default) + "\n")
    print(f"[{name}] ratio={ratio:.4f} goal {goal} -> {'PASS' if passed else 'FAIL'}  ({path})", flush=True)
    return out


def tree_state(measures: Sequence[str]) -> dict[str, Any]:
    """The tree a result was measured from, recorded when it is written: whether it had uncommitted changes
    (`git_dirty`), and which of the measured paths they touch (`dirty_measured`: the number then describes no
    commit, and the table marks it stale)."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *measures], cwd=ROOT,
                             capture_output=True, text=True, timeout=5)
        anything = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                  capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return {"git_dirty": None, "dirty_measured": None}
    return {"git_dirty": bool(anything.stdout.strip()),
            "dirty_measured": sorted(line[3:] for line in out.stdout.splitlines() if line.strip())}


def _default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return repr(o)


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank-with-interpolation percentile (q in 0..100) of a non-empty sequence."""
    s = sorted(xs)
    if not s:
        raise ValueError("percentile of an empty sequence")
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (k - lo))
