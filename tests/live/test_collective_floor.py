"""The mesh ceiling collective_unshaped's floor is measured against (bench/), through the real proxies.
The floor's arithmetic: tests/unit/test_collective_floor.py."""

from __future__ import annotations

from bench.common import MiB, BenchCluster
from bench.emulator_ceiling import mesh_transfer
from ground.config import LinkProfile, LinkSpec, WanConfig


def test_mesh_transfer_moves_every_byte_on_every_link_through_the_real_proxies() -> None:
    sites, lat_ms = ["a", "b", "c"], 5
    spec = LinkSpec(up=LinkProfile(lat_ms, 0, 0), down=LinkProfile(lat_ms, 0, 0))
    links = {f"{x}_to_{y}": spec for x in sites for y in sites if x != y}
    with BenchCluster(sites, links, WanConfig(curve=True)) as cl:
        blobs = {s: cl.nodes[s].inbox("blob") for s in sites}
        cl.start()
        seconds, moved = mesh_transfer(cl, blobs, 1 * MiB, tag=1)
        # collective-class bytes each process received per link (both directions of its connections)
        rx = {(r["link"], r["direction"]): r["bytes"] for n in cl.nodes.values() for r in n.counters.snapshot()
              if r["side"] == "rx" and r["cls"] == "collective"}
    assert moved == 6 * MiB
    assert seconds > lat_ms / 1000  # it went through the shaped proxies, not around them
    # every directed pair x -> y carried its MiB over its own proxy x_to_y (x is that proxy's client: "up")
    assert sorted(rx) == sorted((name, "up") for name in links)
    assert all(b >= 1 * MiB for b in rx.values())
