"""The `ClusterHandle` of a docker-compose cluster: the same fault parts, acted out with the docker CLI.

Every process of the cluster is one container of the compose project (service `coordinator`,
`store`, `site-<name>`, see `ground.topology.service_name`); the nemeses of chaos/nemesis.py send
signals and restarts, and this handle turns them into docker commands:

    SIGKILL / SIGTERM / any other signal   docker kill --signal <SIG> <container>
    SIGSTOP (a hang, a frozen site)        docker pause <container>     (the cgroup freezer:
    SIGCONT                                docker unpause <container>    PID 1 of a container
                                                                         cannot be SIGSTOPped reliably)
    restart an exited process              docker start <container>
    is it running                          docker inspect --format {{.State.Status}} <container>

The container of a service is found by the labels compose puts on it
(`com.docker.compose.project`, `com.docker.compose.service`), so no `container_name` is needed and
two projects can run side by side. Every docker command goes through `runner(argv) -> (rc, stdout,
stderr)` (default: subprocess), so tests check the exact commands without a Docker engine.

Toxiproxy is the compose `toxiproxy` service; from the host it is reached on the published API
port (127.0.0.1:8474 by default), from a container of the project at toxiproxy:8474 (the address
RUN/topology.json records). Events go to RUN/logs/chaos.jsonl in the shared runs volume, like the
native handle's.
"""

from __future__ import annotations

import argparse
import signal as _signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from chaos.handle import (ChaosError, EventSink, LinkStream, _proxies_of_topology, chaos_log, resolve_links,
                          toxiproxy_client)

Runner = Callable[[Sequence[str]], tuple[int, str, str]]


def subprocess_runner(argv: Sequence[str], timeout_s: float = 30.0) -> tuple[int, str, str]:
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise ChaosError(f"cannot run {argv[0]!r}: the docker CLI is not installed") from None
    except subprocess.TimeoutExpired:
        return 124, "", f"{' '.join(argv)}: timed out after {timeout_s:g} s"
    return p.returncode, p.stdout, p.stderr


class DockerHandle:
    """A compose cluster seen through the docker CLI (see the module docstring).

    project: the compose project name (`name:` of compose/docker-compose.yml, "xdc").
    toxiproxy_api: "host:port" of Toxiproxy's API as seen from where this handle runs; default
        the `toxiproxy_api` of RUN/topology.json (right inside the project's network).
    """

    def __init__(self, run_dir: str | Path, project: str = "xdc", *, runner: Runner | None = None,
                 docker: str = "docker", toxiproxy: Any = None, toxiproxy_api: str | None = None,
                 log: EventSink | None = None, run_id: str | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        from ground.topology import Topology, service_name

        self.run_dir = Path(run_dir)
        self.project = project
        self.runner = runner or subprocess_runner
        self.docker = docker
        self.sleep = sleep
        self._service_name = service_name
        topo_path = self.run_dir / "topology.json"
        try:
            self.topology = Topology.load(topo_path)
        except FileNotFoundError:
            raise ChaosError(f"{topo_path} not found: has the compose `init` service prepared {self.run_dir}?") from None
        self._proxies = _proxies_of_topology(self.topology)
        self.toxiproxy = toxiproxy or toxiproxy_client(toxiproxy_api or self.topology.toxiproxy_api, topo_path)
        self.log = log or chaos_log(self.run_dir, run_id)

    # ---- docker ------------------------------------------------------------------------

    def _docker(self, *args: str) -> str:
        argv = [self.docker, *args]
        rc, out, err = self.runner(argv)
        if rc != 0:
            raise ChaosError(f"`{' '.join(argv)}` failed (exit {rc}): {err.strip() or out.strip()}")
        return out

    def _processes(self) -> list[str]:
        return self.topology.processes()

    def container(self, process: str) -> str:
        """The id of the process's container (running or not)."""
        if process not in self._processes():
            raise ChaosError(f"no such process {process!r}; known: {sorted(self._processes())}")
        service = self._service_name(process)
        out = self._docker("ps", "--all", "--quiet", "--no-trunc",
                           "--filter", f"label=com.docker.compose.project={self.project}",
                           "--filter", f"label=com.docker.compose.service={service}")
        ids = [line.strip() for line in out.splitlines() if line.strip()]
        if not ids:
            raise ChaosError(f"no container of service {service!r} in compose project {self.project!r} "
                             "(is the cluster up? is the project name right? see `docker compose ls`)")
        return ids[0]

    def status(self, process: str) -> str:
        """created, running, paused, restarting, removing, exited or dead."""
        return self._docker("inspect", "--format", "{{.State.Status}}", self.container(process)).strip()

    def pid(self, process: str) -> int | None:
        try:
            out = self._docker("inspect", "--format", "{{.State.Pid}}", self.container(process)).strip()
        except ChaosError:
            return None
        try:
            pid = int(out)
        except ValueError:
            return None
        return pid if pid > 0 else None

    # ---- the ClusterHandle protocol ----------------------------------------------------

    def is_running(self, process: str) -> bool:
        return self.status(process) in ("running", "paused", "restarting")

    def signal(self, process: str, sig: int) -> None:
        name = _signal.Signals(sig).name
        cid = self.container(process)
        state = self._docker("inspect", "--format", "{{.State.Status}}", cid).strip()
        if state not in ("running", "paused", "restarting"):
            raise ChaosError(f"cannot send {name} to {process!r} (container {cid[:12]}): it is not running ({state})")
        if sig == _signal.SIGSTOP:
            if state != "paused":
                self._docker("pause", cid)
            return
        if sig == _signal.SIGCONT:
            if state == "paused":
                self._docker("unpause", cid)
            return
        if state == "paused" and sig != _signal.SIGKILL:
            # A frozen container gets nothing until it thaws (like SIGTERM to a SIGSTOPped process,
            # which waits for SIGCONT); docker refuses to signal it, so the signal is refused here too.
            raise ChaosError(f"cannot send {name} to {process!r}: its container is paused (send SIGCONT first)")
        self._docker("kill", "--signal", name, cid)

    def wait_exit(self, process: str, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while self.is_running(process):
            if time.monotonic() >= end:
                return False
            self.sleep(0.1)
        return True

    def restart(self, process: str) -> int:
        cid = self.container(process)
        if self.is_running(process):
            raise ChaosError(f"cannot restart {process!r}: it is still running (container {cid[:12]})")
        self._docker("start", cid)
        return self.pid(process) or 0

    def links(self, target: str) -> list[LinkStream]:
        return resolve_links(target, self._proxies)


def until_coordinator_exits(handle: DockerHandle, taken_down: Callable[[], set[str]]) -> Callable[[], bool]:
    """The run is over once the coordinator's container exited by itself (not by a fault).

    Exited, not merely "not running": a driver started with `docker compose up` finds the container
    created and not yet started (it waits for the store and the sampler), which is no end at all.
    """
    from ground.topology import COORD

    def check() -> bool:
        try:
            return handle.status(COORD) in ("exited", "dead") and COORD not in taken_down()
        except ChaosError:
            return False

    return check


def main(argv: list[str] | None = None) -> int:
    """`xdc chaos SCENARIO --run RUN_DIR --docker`: run a scenario against a live compose cluster."""
    from chaos.driver import run_scenario, wait_for_topology
    from chaos.scenario import ScenarioError, load_scenario

    ap = argparse.ArgumentParser(prog="xdc chaos --docker", description=main.__doc__)
    ap.add_argument("scenario")
    ap.add_argument("--run", required=True, type=Path, help="the run directory in the runs volume")
    ap.add_argument("--project", default="xdc", help="compose project name (default: xdc)")
    ap.add_argument("--toxiproxy", help="Toxiproxy API host:port as seen from here (host: 127.0.0.1:8474)")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--wait-s", type=float, default=120.0)
    ap.add_argument("--interval-s", type=float, default=0.2)
    args = ap.parse_args(argv)
    run_dir = args.run.resolve()
    sites = wait_for_topology(run_dir, args.wait_s, 0.5)
    if sites is None:
        return 2
    try:
        sc = load_scenario(args.scenario, sites=sites)
        handle = DockerHandle(run_dir, args.project, toxiproxy_api=args.toxiproxy)
    except (ScenarioError, ChaosError) as e:
        print(f"chaos: {e}", file=sys.stderr)
        return 2
    return run_scenario(sc, handle, run_dir, dry_run=args.dry_run, interval_s=args.interval_s,
                        finished=lambda driver: until_coordinator_exits(handle, lambda: set(driver.taken_down())))

if __name__ == "__main__":
    sys.exit(main())
