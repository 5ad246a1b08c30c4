"""collective_unshaped's floor (bench/): the mesh floor against the per-link floor. The mesh ceiling
through the real proxies: tests/live/test_collective_floor.py."""

from __future__ import annotations

import pytest

from bench.collective_unshaped import mesh_floor_s, per_link_floor_s


def test_mesh_floor_equals_the_per_link_floor_when_links_are_independent() -> None:
    # Six independent links each at C carry 6 C together: the two floors must then agree.
    payload, c_link, lat = 3_369_984, 300e6, 0.02
    floor, moved = mesh_floor_s(lat, payload, 3, 6 * c_link)
    assert moved == 4 * payload
    assert floor == pytest.approx(per_link_floor_s(lat, payload, 3, c_link))
    # Links that share the machine (the mesh carries what one link does) make the floor higher.
    assert mesh_floor_s(lat, payload, 3, c_link)[0] > floor
