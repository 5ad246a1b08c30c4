"""The native launcher (the embedded default, no Docker): one run as local OS processes.

`launch(cfg)` starts the real toxiproxy-server on loopback (proxy metrics on), creates one
proxy per directed link from the topology and applies the link profiles, writes the run
directory (resolved config, topology, keys), starts the checkpoint store, the coordinator
and the site agents as separate processes, shows progress from their logs, and on the end
of the run (or Ctrl-C / SIGTERM) stops every process it started. After every process has
closed its sockets it reads Toxiproxy's byte counters (Toxiproxy counts a connection's
bytes when the connection closes), stops Toxiproxy and writes `summary.json`.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from analysis.summary import summarize
from site_agent.baselines import run_baselines
from wan.keys import generate_cluster_keys
from wan.toxiproxy import ToxiproxyClient, ToxiproxyError, ToxiproxyServer, apply_link_spec, free_port
from ground.config import STANDBY_NEXT_AFTER_S, RunConfig, save_config
from ground.eventlog import EventLog
from ground.provenance import run_started_fields
from cluster.forkserver import ForkServer
from cluster.progress import Progress
from ground.processes import start_order, stop_order, wan_processes
from ground.topology import COORD, STORE, Link, Topology, plan_topology

_PR_SET_PDEATHSIG = 1
SITES_FINISH_S = 30.0  # after the coordinator finished a run, how long the sites may take to exit
WATCH_PERIOD_S = 0.25  # the launcher checks its processes and redraws progress this often
CHAOS_POLL_S = 0.05  # and polls the chaos driver this often (its reaction to a triggering commit)


def _die_with_parent() -> None:
    """Child side of Popen: get SIGTERM if the launcher dies, so no process is orphaned."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def why_no_fork(cfg: RunConfig) -> str | None:
    """Why this run's sites must start cold although `cluster.fork_server` is on, or None. A CUDA driver
    initialised in a process is not usable in a child forked from it, and importing torch's compiler
    stack may initialise it: so the fork server serves CPU sites only (a device node means "auto" may
    pick the GPU)."""
    device = cfg.train.device
    if device == "cuda" or (device == "auto" and os.path.exists("/dev/nvidiactl")):
        return f"train.device {device!r} on a machine with an NVIDIA device: the sites start cold (a CUDA " \
               f"driver initialised before a fork is not usable after it)"
    return None


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid() % 10000:04d}{int(time.time_ns() % 1000):03d}"


def provision_run_dir(cfg: RunConfig, run_dir: str | Path, plan: Topology, client: ToxiproxyClient, log: EventLog,
                      *, toxiproxy_api: str | None = None, new_port: Callable[[], int] | None = None) -> Topology:
    """What every way of running a cluster does before its processes start (the native launcher
    and `xdc prepare` for compose): write RUN/config.json and RUN/keys, create one Toxiproxy proxy
    per link of `plan` with its link profile, and write the resolved RUN/topology.json.

    A link whose planned `listen` has port 0 gets the port Toxiproxy picked; otherwise the planned
    address (e.g. `toxiproxy:20003`, the name clients dial) is kept. With `new_port`, a planned
    loopback port that something else took meanwhile is replaced by a fresh one (twice at most).
    """
    run_dir = Path(run_dir)
    # The services' own folders too (the coordinator's journal, the store's blobs): under compose only
    # their owners may write them, mounted over in every other service (xdc/compose.py).
    for d in ("logs", "coordinator", "store"):
        (run_dir / d).mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.json")
    if cfg.wan.curve:
        generate_cluster_keys(run_dir / "keys", plan.processes())
    links: dict[str, Link] = {}
    for name, link in plan.links.items():
        for attempt in range(3):
            try:
                proxy = client.create_proxy(name, link.proxy_listen or link.listen, link.upstream)
                break
            except ToxiproxyError as e:
                if new_port is None or attempt == 2 or "address already in use" not in str(e):
                    raise
                host = (link.proxy_listen or link.listen).rsplit(":", 1)[0]
                addr = f"{host}:{new_port()}"
                log.emit("proxy_port_taken", proxy=name, tried=link.proxy_listen or link.listen, retry=addr)
                link = replace(link, listen=addr, proxy_listen=addr)
        toxics = apply_link_spec(client, name, cfg.link_spec(name))
        listen = proxy.listen if (not link.listen or link.listen.endswith(":0")) else link.listen
        links[name] = replace(link, listen=listen, proxy_listen=proxy.listen)
        log.emit("proxy_created", proxy=name, listen=listen, upstream=link.upstream, toxics=toxics)
    topo = replace(plan, links=links, toxiproxy_api=toxiproxy_api if toxiproxy_api is not None else plan.toxiproxy_api)
    topo.save(run_dir / "topology.json")
    return topo


class Launcher:
    def __init__(self, cfg: RunConfig, *, quiet: bool = False, on_progress: Callable[[dict], None] | None = None,
                 timeout_s: float = 1800.0, scenario: Any = None) -> None:
        if not cfg.run_id:
            cfg = replace(cfg, run_id=new_run_id())
        self.cfg = cfg
        self.run_dir = Path(cfg.runs_dir) / cfg.run_id
        self.quiet = quiet
        self.timeout_s = timeout_s
        self.procs: dict[str, subprocess.Popen] = {}
        self.exit_codes: dict[str, int | None] = {}
        # Exit statuses of the incarnations a chaos restart replaced (the last one is in exit_codes): an
        # earlier incarnation's own error exit (70: a dead I/O thread) must not vanish behind its successor's 0.
        self.earlier_exit_codes: dict[str, list[int | None]] = {}
        self.toxi: ToxiproxyServer | None = None
        self.interrupted = False
        self.timed_out = False  # the launcher stopped the run after timeout_s: not a clean end
        self.log: EventLog | None = None
        self.standby: subprocess.Popen | None = None  # recovery.warm_standby: the prepared site process
        self.standby_due: float | None = None  # monotonic time at which to start the next standby
        self._standbys = 0
        if scenario is not None:
            # A scenario built in Python (Scenario.build) is checked only against itself: check its
            # targets against this run's processes now, before anything starts (a link spec such as
            # 'a_to_b' would otherwise fail only when the fault fires, mid-run, as `fault_failed`).
            from chaos.scenario import Scenario

            Scenario.from_dict(scenario.to_dict(), source=f"scenario {scenario.name!r}", sites=cfg.cluster.sites)
        self.scenario = scenario  # chaos.scenario.Scenario or None
        self.chaos: Any = None
        self.modules: dict[str, tuple[str, tuple[str, ...]]] = {}
        self.forkserver: ForkServer | None = None  # cluster.fork_server: forks the site processes

    # ------------------------------------------------------------------ setup
    def prepare(self) -> Topology:
        cfg = self.cfg
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.log = EventLog(self.run_dir / "logs" / "launcher.jsonl", cfg.run_id, "launcher")
        save_config(cfg, self.run_dir / "config.json")  # first, as before: a failed start still has it
        self.log.emit("run_started", **run_started_fields())
        gpu = why_no_fork(cfg) if cfg.cluster.fork_server else None
        if gpu is not None:
            self.log.emit("forkserver_skipped", reason=gpu)
        elif cfg.cluster.fork_server:
            # Started first: its imports (torch, the site code) overlap Toxiproxy, the baselines and the
            # store's start; the sites are forked from it once it is ready.
            self.forkserver = ForkServer(self._child_env(), self.run_dir / "logs" / "forkserver.out",
                                         preexec_fn=_die_with_parent)
            self.forkserver.start()
            assert self.forkserver.proc is not None
            self.log.emit("process_started", name="forkserver", child_pid=self.forkserver.proc.pid,
                          module="cluster.forkserver")
        self.log.emit("baselines", **run_baselines(cfg))  # ~0.5 CPU-s: count models on the run's eval set
        sites = tuple(cfg.cluster.sites)
        host = cfg.cluster.host
        # Choose every port here, distinct from one another: with listen port 0 Toxiproxy could pick
        # a port a process is about to bind (seen once in a soak as "Address already in use").
        taken: set[int] = set()

        def distinct_port() -> int:
            while True:
                port = free_port(host)
                if port not in taken:
                    taken.add(port)
                    return port

        # Toxiproxy first: its API port is bound before the others are chosen, so none of them can be
        # it (a soak run once chose a proxy port that Toxiproxy's API had just taken).
        self.toxi = ToxiproxyServer(host=host, port=0, log_path=self.run_dir / "logs" / "toxiproxy.out")
        client = self.toxi.start()
        taken.add(int(self.toxi.api_address.rsplit(":", 1)[1]))
        self.log.emit("process_started", name="toxiproxy", child_pid=self.toxi.proc.pid, api=self.toxi.api_address)
        ports = {p: distinct_port() for p in wan_processes(sites)}
        proxy_ports = {name: distinct_port() for name, _c, _s in Topology.link_names(sites)}
        plan = plan_topology(sites, "native", host=host, ports=ports, proxy_ports=proxy_ports)
        topo = provision_run_dir(cfg, self.run_dir, plan, client, self.log, toxiproxy_api=self.toxi.api_address,
                                 new_port=distinct_port)
        latest = Path(cfg.runs_dir) / "latest"
        try:
            if latest.is_symlink() or latest.exists():
                latest.unlink()
            latest.symlink_to(cfg.run_id)
        except OSError:
            pass
        return topo

    def _child_env(self) -> dict[str, str]:
        threads = self.cfg.train.threads_per_site or max(1, (os.cpu_count() or 1) // len(self.cfg.cluster.sites))
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env

    def _spawn(self, name: str, module: str, *extra: str) -> None:
        self.modules[name] = (module, extra)
        out_path = self.run_dir / "logs" / f"{name}.out"  # appended to: a restarted process keeps the earlier output
        if self.forkserver is not None and module == "site_agent.agent":
            self.procs[name] = self.forkserver.spawn(module, ["--run-dir", str(self.run_dir), *extra],  # type: ignore[assignment]
                                                     out_path)
            assert self.log is not None
            self.log.emit("process_started", name=name, child_pid=self.procs[name].pid, module=module,
                          forked=True)
            return
        out = open(out_path, "ab")
        self.procs[name] = subprocess.Popen([sys.executable, "-m", module, "--run-dir", str(self.run_dir), *extra],
                                            stdout=out, stderr=subprocess.STDOUT, env=self._child_env(),
                                            preexec_fn=_die_with_parent)
        assert self.log is not None
        self.log.emit("process_started", name=name, child_pid=self.procs[name].pid, module=module)

    def respawn(self, name: str) -> subprocess.Popen:
        """Start a process again (a chaos restart); the launcher owns it like the first one. A site is
        handed to the warm standby when there is one (recovery.warm_standby)."""
        old = self.procs.get(name)
        if old is not None:
            try:
                old.wait(2.0)  # a killed incarnation has exited (or is about to); never block a restart long
            except subprocess.TimeoutExpired:
                pass
            self.earlier_exit_codes.setdefault(name, []).append(old.poll())
        if name in self.cfg.cluster.sites and self._take_standby(name):
            return self.procs[name]
        module, extra = self.modules[name]
        self._spawn(name, module, *extra)
        return self.procs[name]

    # ------------------------------------------------------------ warm standby
    def _wants_standby(self) -> bool:
        """Only chaos restarts use a standby, and only a single-process site can be one."""
        return bool(self.cfg.recovery.warm_standby and self.scenario is not None
                    and self.cfg.train.workers_per_site == 1)

    def _spawn_standby(self) -> None:
        """Start a site process that prepares (site_agent/standby.py), then waits on stdin for its name."""
        self._standbys += 1
        out_path = self.run_dir / "logs" / f"standby-{self._standbys}.out"
        with open(out_path, "ab") as out:  # the child holds its own copy of the descriptor
            self.standby = subprocess.Popen(
                [sys.executable, "-m", "site_agent.agent", "--run-dir", str(self.run_dir), "--standby"],
                stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=self._child_env(),
                preexec_fn=_die_with_parent)
        self.standby_due = None
        assert self.log is not None
        self.log.emit("standby_started", child_pid=self.standby.pid, output=out_path.name)

    def _take_standby(self, name: str) -> bool:
        """Hand site `name` to the standby: True when it took it (it is then `procs[name]`)."""
        sb, self.standby = self.standby, None
        if sb is None:
            return False
        assert self.log is not None
        if sb.poll() is not None:
            self.log.emit("standby_unusable", site=name, reason=f"the standby had exited with {sb.returncode}")
        else:
            try:
                assert sb.stdin is not None
                sb.stdin.write(f"{name}\n".encode())
                sb.stdin.close()
            except OSError as e:
                self.log.emit("standby_unusable", site=name, reason=f"could not name it: {e}")
                sb.kill()
                sb.wait()
            else:
                self.procs[name] = sb
                self.log.emit("process_started", name=name, child_pid=sb.pid, module="site_agent.agent",
                              warm_standby=True)
                self.standby_due = time.monotonic() + STANDBY_NEXT_AFTER_S
                return True
        self.standby_due = time.monotonic()  # replace the dead one at once; this restart starts cold
        return False

    def _tend_standby(self) -> None:
        """Start the next standby when one is due (from the watch loop)."""
        if self.standby_due is not None and time.monotonic() >= self.standby_due and not self.interrupted:
            self._spawn_standby()

    def _stop_standby(self) -> None:
        sb, self.standby = self.standby, None
        self.standby_due = None
        if sb is None:
            return
        if sb.poll() is None:
            sb.terminate()  # preparing or waiting: it has no state and no connection yet
            try:
                sb.wait(5)
            except subprocess.TimeoutExpired:
                sb.kill()
                sb.wait()
        if sb.stdin is not None:
            sb.stdin.close()

    def _start_chaos(self) -> None:
        from chaos.driver import ChaosDriver
        from chaos.handle import NativeHandle

        (self.run_dir / "scenario.json").write_text(json.dumps(self.scenario.to_dict(), indent=2, sort_keys=True))
        handle = NativeHandle(self.run_dir, procs=self.procs, spawn=self.respawn)
        self.chaos = ChaosDriver(self.scenario, handle, self.run_dir)

    def _stop_chaos(self) -> None:
        if self.chaos is None:
            return
        try:
            self.chaos.heal_all()  # a SIGSTOPped process must get SIGCONT before it can act on SIGTERM
            self.chaos.finish()
        except Exception as e:  # never let chaos bookkeeping leave processes behind
            if self.log is not None:
                self.log.emit("chaos_finish_failed", error=f"{type(e).__name__}: {e}")

    def chaos_outcome(self) -> dict[str, Any] | None:
        """What the scenario did, fault by fault, from the driver: fired (injected; an instant or
        healed fault included), never_fired (its trigger never came), failed (the injection raised).
        None without a scenario. Indices are the faults' positions in scenario.json."""
        if self.scenario is None:
            return None
        from chaos.driver import FAILED, PENDING

        status = {st.index: st.status for st in self.chaos.states} if self.chaos is not None else {}
        faults = [{"index": i, "kind": f.kind, "target": f.target, "trigger": f.trigger.to_dict(),
                   "status": status.get(i, PENDING)} for i, f in enumerate(self.scenario.faults)]
        return {"scenario": self.scenario.name, "n_faults": len(self.scenario.faults),
                "started": bool(self.chaos is not None and self.chaos.started), "faults": faults,
                "fired": [f["index"] for f in faults if f["status"] not in (PENDING, FAILED)],
                "never_fired": [f for f in faults if f["status"] == PENDING],
                "failed": [f for f in faults if f["status"] == FAILED]}

    # -------------------------------------------------------------------- run
    def run(self) -> dict:
        prev = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

        def _interrupt(signum: int, _frame: object) -> None:
            self.interrupted = True

        for s in prev:
            signal.signal(s, _interrupt)
        summary: dict = {}
        try:
            self.prepare()
            self._start_all()  # the table's start order: the energy sampler first (its idle baseline)
            if self.scenario is not None:
                self._start_chaos()
            if self._wants_standby():
                self._spawn_standby()
            self._watch()
        finally:
            self._stop_chaos()
            self._stop_standby()
            self._stop_all()  # the table's stop order: the energy sampler last (its idle baseline after)
            if self.forkserver is not None:
                self.forkserver.close()  # its children are stopped already; it stops any it still has
            proxy_bytes = {}
            if self.toxi is not None:
                try:
                    proxy_bytes = self.toxi.client.proxy_bytes()
                except Exception as e:  # report, but never leave processes behind
                    proxy_bytes = {"error": f"{type(e).__name__}: {e}"}
                self.toxi.stop()
            if self.log is not None:
                # Toxiproxy's own per-proxy byte totals go into the history, so `xdc analyze` can
                # reconcile the six classes against them from the logs alone.
                self.log.emit("proxy_counters", proxies=proxy_bytes, source="toxiproxy /metrics "
                              "toxiproxy_proxy_received_bytes_total")
                self.log.emit("run_finished", exit_codes=self.exit_codes, interrupted=self.interrupted,
                              timed_out=self.timed_out, earlier_exit_codes=self.earlier_exit_codes)
                self.log.close()
            if (self.run_dir / "config.json").exists():
                summary = summarize(self.run_dir, proxy_bytes=proxy_bytes, exit_codes=self.exit_codes,
                                    interrupted=self.interrupted, earlier_exit_codes=self.earlier_exit_codes)
                summary["timed_out"] = self.timed_out
                if self.timed_out:  # every process may exit 0 on SIGTERM, but the run did not end by itself
                    summary["clean_exit"] = False
                outcome = self.chaos_outcome()
                if outcome is not None:
                    summary["chaos"] = outcome
                (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
            for s, h in prev.items():
                signal.signal(s, h)
        return summary

    def _watch(self) -> None:
        prog = Progress(self.run_dir, self.cfg, quiet=self.quiet)
        deadline = time.monotonic() + self.timeout_s
        workers = [COORD, *self.cfg.cluster.sites]
        finished_at: float | None = None  # when the coordinator finished the run (under a scenario)
        with prog:
            while True:
                if self.chaos is not None:
                    self.chaos.poll()
                self._tend_standby()
                prog.update()
                if self.interrupted:
                    prog.note("interrupted: stopping every process")
                    return
                done = {n: p.poll() for n, p in self.procs.items()}
                taken = set(self.chaos.taken_down()) if self.chaos is not None else set()
                if self.chaos is not None:
                    # Under a scenario processes die on purpose; the run ends when the coordinator
                    # finishes it and the sites have finished too (their last checkpoint, their
                    # counters), or when the coordinator dies and chaos will not bring it back.
                    if done[COORD] == 0:
                        finished_at = finished_at or time.monotonic()
                        sites_done = all(done[s] is not None for s in self.cfg.cluster.sites)
                        if sites_done or time.monotonic() - finished_at > SITES_FINISH_S:
                            prog.update()
                            return
                    elif done[COORD] is not None and COORD not in taken:
                        prog.update()
                        time.sleep(0.5)
                        return
                elif all(done[n] is not None for n in workers):
                    prog.update()
                    return
                else:
                    failed = [n for n in workers if done[n] not in (None, 0)]
                    if failed or done[STORE] is not None:
                        prog.note(f"process exited early: {failed or [STORE]}; stopping the run")
                        time.sleep(1.0)
                        return
                if time.monotonic() > deadline:
                    prog.note(f"run exceeded {self.timeout_s:.0f} s; stopping it")
                    self.timed_out = True
                    return
                self._pause(WATCH_PERIOD_S)

    def _pause(self, period_s: float) -> None:
        """Sleep one watch period, polling the chaos driver every CHAOS_POLL_S meanwhile: the sites
        wait at a fault gate (ground/gates.py) until the driver has seen the triggering commit and
        acted, so its reaction time is time every site spends waiting."""
        end = time.monotonic() + period_s
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, CHAOS_POLL_S if self.chaos is not None else left))
            if self.chaos is not None and time.monotonic() < end:
                self.chaos.poll()

    def _start_all(self) -> None:
        """Start every process of the table (ground/processes.py) in its start order; a process with
        a hook is started by its hook (which may decide not to start it)."""
        sites = tuple(self.cfg.cluster.sites)
        for p in start_order():
            if p.hook:
                importlib.import_module(p.hook).start(self)
                continue
            for name in p.names(sites):
                self._spawn(name, p.module, *p.args(name))

    def _stop_all(self) -> None:
        """Stop every process in the table's stop order: consecutive plain processes together (SIGTERM
        all, then wait), a process with a hook by its hook; record every exit status."""
        sites = tuple(self.cfg.cluster.sites)
        batch: list[str] = []
        for p in stop_order():
            if not p.hook:
                batch += p.names(sites)
                continue
            self._terminate(batch)
            batch = []
            importlib.import_module(p.hook).stop(self)
        self._terminate(batch)

    def _terminate(self, order: list[str]) -> None:
        """SIGTERM what still runs, wait, SIGKILL stragglers; record every exit status."""
        for name in order:
            p = self.procs.get(name)
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for name in order:
            p = self.procs.get(name)
            if p is None:
                continue
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            self.exit_codes[name] = p.returncode


def launch(cfg: RunConfig, **kw: object) -> tuple[Path, dict]:
    ln = Launcher(cfg, **kw)  # type: ignore[arg-type]
    summary = ln.run()
    return ln.run_dir, summary
