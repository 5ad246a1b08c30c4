"""The short soak: one random fault schedule per policy (the full one is `make soak`)."""

from __future__ import annotations

import pytest

from chaos.soak import random_schedule, soak_one


def test_random_schedules_are_reproducible_and_valid():
    assert random_schedule(7) == random_schedule(7)
    kinds = {f.kind for seed in range(40) for f in random_schedule(seed).faults}
    assert kinds == {"site_crash", "site_hang", "link_reset", "link_blackhole"}


@pytest.mark.parametrize("policy", ["stall", "restart", "elastic", "oracle"])
def test_short_soak_reaches_frontier_with_intact_store_and_balanced_ledger(tmp_path, policy):
    r = soak_one(1003, policy, tmp_path)
    assert r["reached_frontier"], r
    assert r["ledger_balanced"], r
    assert r["store_verified"], r
