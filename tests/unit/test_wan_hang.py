"""The ZMTP heartbeat timeout's setting (ground/config.py WanConfig): the default outlasts every stop a
scenario gives, and one not above the ping interval is refused. Why, and the real stopped peer:
tests/live/test_wan_hang.py."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from ground.config import ConfigError, WanConfig


def test_default_zmtp_timeout_outlasts_every_stop_a_scenario_gives() -> None:
    """The longest SIGSTOP the stress families draw: site_hang 6 s (straggler, severe), store
    outage in mode stop 25 s (store-outage, severe)."""
    from chaos.families import FAMILIES, generate

    longest = 0.0
    for fam in FAMILIES:
        for sev in ("mild", "severe"):
            for seed in range(40):
                sc = generate(fam, sev, seed=seed, target_useful_tokens=524_288)
                for f in sc.faults:
                    if f.kind == "site_hang" or (f.kind == "store_outage" and f.params.get("mode") == "stop"):
                        longest = max(longest, float(f.duration_s or 0))
    assert longest > 0
    assert WanConfig().zmq_heartbeat_timeout_ms > longest * 1000


def test_zmtp_timeout_not_above_the_ping_interval_is_refused() -> None:
    with pytest.raises(ConfigError, match="zmq_heartbeat_timeout_ms"):
        WanConfig(zmq_heartbeat_ivl_ms=1000, zmq_heartbeat_timeout_ms=1000)
    assert asdict(WanConfig(zmq_heartbeat_ivl_ms=0, zmq_heartbeat_timeout_ms=0))["zmq_heartbeat_ivl_ms"] == 0
