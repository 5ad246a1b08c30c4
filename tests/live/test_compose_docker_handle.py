"""DockerHandle: the same fault parts as the native handle, acted out as docker CLI commands (checked
exactly, through an injected runner; no engine needed), and `xdc prepare` against a real Toxiproxy."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from chaos.docker_handle import DockerHandle
from chaos.handle import ChaosError, ClusterHandle, MemoryLog
from chaos.nemesis import nemesis_for
from chaos.scenario import Fault, Trigger
from ground.topology import plan_topology

SITES = ("a", "b", "c")


class FakeDocker:
    """A docker CLI with containers per compose service; records every argv."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.state = {svc: "running" for svc in ("coordinator", "store", "site-a", "site-b", "site-c")}

    def __call__(self, argv):  # type: ignore[no-untyped-def]
        argv = list(argv)
        self.calls.append(argv)
        cmd = argv[1]
        if cmd == "ps":
            svc = argv[-1].rsplit("=", 1)[1]
            return (0, f"id-{svc}\n", "") if svc in self.state else (0, "", "")
        svc = argv[-1].removeprefix("id-")
        if cmd == "inspect":
            if "{{.State.Pid}}" in argv:
                return 0, "0\n" if self.state[svc] == "exited" else "4242\n", ""
            return 0, self.state[svc] + "\n", ""
        if cmd == "kill":
            self.state[svc] = "exited" if argv[3] in ("SIGKILL", "SIGTERM") else self.state[svc]
        elif cmd == "pause":
            self.state[svc] = "paused"
        elif cmd == "unpause":
            self.state[svc] = "running"
        elif cmd == "start":
            self.state[svc] = "running"
        return 0, "", ""

    def actions(self) -> list[list[str]]:
        return [c for c in self.calls if c[1] not in ("ps", "inspect")]


@pytest.fixture
def handle(tmp_path: Path) -> tuple[DockerHandle, FakeDocker]:
    plan_topology(SITES, "compose").save(tmp_path / "topology.json")
    fake = FakeDocker()
    return DockerHandle(tmp_path, runner=fake, toxiproxy=object(), log=MemoryLog(), sleep=lambda s: None), fake


def test_it_is_a_cluster_handle(handle) -> None:  # type: ignore[no-untyped-def]
    h, _ = handle
    assert isinstance(h, ClusterHandle)


def test_exact_docker_commands(handle) -> None:  # type: ignore[no-untyped-def]
    h, fake = handle
    assert h.container("a") == "id-site-a"
    assert fake.calls[0] == ["docker", "ps", "--all", "--quiet", "--no-trunc",
                             "--filter", "label=com.docker.compose.project=xdc",
                             "--filter", "label=com.docker.compose.service=site-a"]
    h.signal("b", signal.SIGSTOP)
    h.signal("b", signal.SIGCONT)
    h.signal("coord", signal.SIGTERM)
    h.signal("a", signal.SIGKILL)
    assert not h.is_running("a") and h.wait_exit("a", 1.0)
    assert h.restart("a") == 4242
    assert fake.actions() == [["docker", "pause", "id-site-b"], ["docker", "unpause", "id-site-b"],
                              ["docker", "kill", "--signal", "SIGTERM", "id-coordinator"],
                              ["docker", "kill", "--signal", "SIGKILL", "id-site-a"],
                              ["docker", "start", "id-site-a"]]


def test_refusals_match_the_native_handle(handle) -> None:  # type: ignore[no-untyped-def]
    h, fake = handle
    with pytest.raises(ChaosError, match="no such process"):
        h.signal("z", signal.SIGKILL)
    with pytest.raises(ChaosError, match="still running"):
        h.restart("a")
    h.signal("c", signal.SIGKILL)
    with pytest.raises(ChaosError, match="not running"):
        h.signal("c", signal.SIGKILL)
    fake.state["store"] = "paused"
    with pytest.raises(ChaosError, match="paused"):
        h.signal("store", signal.SIGTERM)
    h2 = DockerHandle(h.run_dir, runner=lambda argv: (1, "", "Cannot connect to the Docker daemon"),
                      toxiproxy=object(), log=MemoryLog())
    with pytest.raises(ChaosError, match="Cannot connect to the Docker daemon"):
        h2.signal("a", signal.SIGKILL)


def test_the_same_fault_parts_drive_it(handle) -> None:  # type: ignore[no-untyped-def]
    """The nemeses of chaos/nemesis.py, unchanged, inject and heal through docker commands."""
    h, fake = handle
    crash = nemesis_for(Fault("site_crash", "b", Trigger(at_s=0.0)), 0)
    crash.inject(h)
    crash.heal(h)
    hang = nemesis_for(Fault("site_hang", "c", Trigger(at_s=0.0), duration_s=1.0), 1)
    hang.inject(h)
    hang.heal(h)
    assert fake.actions() == [["docker", "kill", "--signal", "SIGKILL", "id-site-b"], ["docker", "start", "id-site-b"],
                              ["docker", "pause", "id-site-c"], ["docker", "unpause", "id-site-c"]]
    assert h.links("a<->b") and {p for p, _ in h.links("a<->b")} == {"a_to_b", "b_to_a"}


@pytest.mark.integration
def test_prepare_compose_and_native_against_real_toxiproxy(tmp_path: Path) -> None:
    """`xdc prepare` creates one proxy per link with the launcher's link profiles (one code path)."""
    from wan.toxiproxy import ToxiproxyServer, find_toxiproxy_binary
    from xdc.cli import main as xdc_main
    from ground.topology import Topology, link_map

    find_toxiproxy_binary()  # a missing real server fails the test (it never skips)
    with ToxiproxyServer(host="127.0.0.1", port=0, log_path=tmp_path / "tp.out") as srv:
        client = srv.client
        api = srv.api_address
        for mode in ("native", "compose"):
            run = tmp_path / f"{mode}-run"
            rc = xdc_main(["prepare", "--run-dir", str(run), "--topology", mode, "--toxiproxy", api,
                           "--set", "wan.site_link.up.latency_ms=33", "--sites", "a,b,c"])
            assert rc == 0, f"xdc prepare --topology {mode} failed (compose mode needs ports 20000-20011 free)"
            topo = Topology.load(run / "topology.json")
            assert link_map(topo) == link_map(plan_topology(SITES, "compose"))
            assert topo.toxiproxy_api == api
            cfg = json.loads((run / "config.json").read_text())
            assert cfg["run_id"] == run.name and cfg["wan"]["site_link"]["up"]["latency_ms"] == 33
            assert (run / "keys").is_dir()
            proxies = client.list_proxies()
            assert set(topo.links) <= set(proxies)
            lat = {t["name"]: t["attributes"] for t in client.list_toxics("a_to_b")}
            assert any(a.get("latency") == 33 for a in lat.values()), lat
            if mode == "compose":
                assert topo.links["a_to_b"].listen.startswith("toxiproxy:")
            else:
                assert topo.links["a_to_b"].listen == proxies["a_to_b"].listen
            # a second prepare (a re-run of compose `init`) replaces the proxies instead of failing
            assert xdc_main(["prepare", "--run-dir", str(run), "--topology", mode, "--toxiproxy", api]) == 0
            for name in topo.links:
                client.delete_proxy(name)


def test_the_run_is_over_when_the_coordinator_exited_not_while_it_is_only_created(handle) -> None:  # type: ignore[no-untyped-def]
    """`xdc chaos` attached right after `docker compose up`: the coordinator's container exists but waits
    for its dependencies; that is no end of the run (the driver once ended there, its fault pending)."""
    from chaos.docker_handle import until_coordinator_exits

    h, fake = handle
    taken: set[str] = set()
    over = until_coordinator_exits(h, lambda: taken)
    fake.state["coordinator"] = "created"
    assert not over()
    fake.state["coordinator"] = "running"
    assert not over()
    fake.state["coordinator"] = "exited"
    taken.add("coord")  # killed by the scenario, to be restarted: not the end either
    assert not over()
    taken.clear()
    assert over()
