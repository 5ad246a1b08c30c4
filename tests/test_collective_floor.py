"""collective_unshaped's floor and the mesh ceiling it is measured against (bench/)."""

from __future__ import annotations

import pytest

from bench.collective_unshaped import mesh_floor_s, per_link_floor_s
from bench.common import MiB, BenchCluster
from bench.emulator_ceiling import mesh_transfer
from ground.config import LinkProfile, LinkSpec, WanConfig


def test_mesh_floor_equals_the_per_link_floor_when_links_are_independent() -> None:
    # Six independent links each at C carry 6 C together: the two floors must then agree.
    payload, c_link, lat = 3_369_984, 300e6, 0.02
    floor, moved = mesh_floor_s(lat, payload, 3, 6 * c_link)
    assert moved == 4 * payload
    assert floor == pytest.approx(per_link_floor_s(lat, payload, 3, c_link))
    # Links that share the machine (the mesh carries what one link does) make the floor higher.
    assert mesh_floor_s(lat, payload, 3, c_link)[0] > floor


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
