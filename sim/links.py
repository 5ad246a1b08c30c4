"""The simulated WAN: the config's link profiles (as Toxiproxy gets them) plus the scenario's degradations.

A `link_degrade` adds its latency and caps the bandwidth on the directions it names, on top of
the configured profile, until it heals. The collective's time (sim/model.py) is the slowest
directed link among the members: with no degradation every pair is the same, so one pair is
computed (that keeps a 1,000-site collective O(1)); with degradations, the degraded pairs among
the members are computed too.

A `link_blackhole` or `link_reset` cuts proxies until it heals (`cut`, `is_cut`): the world holds
the messages that would cross one and delivers them after the heal (sim/world.py), and a
collective whose members cannot all hear each other does not complete (sim/rounds.py).
"""

from __future__ import annotations

import math

from ground.config import RunConfig
from sim.engine import ns
from sim.model import SimModel, collective_end_s, collective_s, link_one_way_s, payload_bytes_per_value


class Links:
    def __init__(self, cfg: RunConfig, model: SimModel) -> None:
        self.cfg, self.model = cfg, model
        self.faults: dict[int, tuple[list[tuple[str, str]], int, int]] = {}  # fault -> (pairs, +ms, cap KB/s)
        self._cache: dict[tuple[str, str, int], float] = {}  # one_way_s while the faults stay as they are
        self._cache_ns: dict[tuple[str, str], int] = {}  # one_way_ns (a message's delay), the same
        # Cut proxies (link_blackhole, link_reset): fault -> (the (src, dst) proxies, kind). A proxy
        # carries both streams of the src -> dst connection: src's messages and dst's replies.
        self.cuts: dict[int, tuple[list[tuple[str, str]], str]] = {}

    def cut(self, fault: int, pairs: list[tuple[str, str]], kind: str) -> None:
        self.cuts[fault] = (pairs, kind)

    def uncut(self, fault: int) -> None:
        self.cuts.pop(fault, None)

    def is_cut(self, src: str, dst: str) -> str | None:
        """The kind of the cut on proxy src -> dst (None: it passes data)."""
        for pairs, kind in self.cuts.values():
            if (src, dst) in pairs:
                return kind
        return None

    def cut_into(self, members: tuple[str, ...]) -> dict[str, list[str]]:
        """Per member, the members whose data cannot reach it (a cut proxy from them to it)."""
        out: dict[str, list[str]] = {}
        if not self.cuts:
            return out
        mset = set(members)
        for pairs, _kind in self.cuts.values():
            for a, b in pairs:
                if a in mset and b in mset and a != b:
                    out.setdefault(b, []).append(a)
        return {k: sorted(set(v)) for k, v in out.items()}

    def degrade(self, fault: int, pairs: list[tuple[str, str]], latency_ms: int, bandwidth_kbps: int) -> None:
        self.faults[fault] = (pairs, latency_ms, bandwidth_kbps)
        self._cache.clear()
        self._cache_ns.clear()

    def heal(self, fault: int) -> None:
        self.faults.pop(fault, None)
        self._cache.clear()
        self._cache_ns.clear()

    def one_way_s(self, src: str, dst: str, nbytes: int = 0) -> float:
        key = (src, dst, nbytes)
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = self._one_way_s(src, dst, nbytes)
        return got

    def one_way_ns(self, src: str, dst: str) -> int:
        """A small message's delay in virtual ns (`ns(one_way_s(src, dst))`), kept as one_way_s is:
        every heartbeat and report asks it."""
        got = self._cache_ns.get((src, dst))
        if got is None:
            got = self._cache_ns[(src, dst)] = ns(self.one_way_s(src, dst))
        return got

    def _one_way_s(self, src: str, dst: str, nbytes: int) -> float:
        base = link_one_way_s(self.cfg, src, dst, 0)
        bw = self.cfg.link_spec(f"{src}_to_{dst}").up.bandwidth_kbps
        for pairs, add_ms, cap in self.faults.values():
            if (src, dst) in pairs:
                base += add_ms / 1000.0
                bw = min(bw, cap) if bw and cap else (cap or bw)
        return base + (nbytes / (bw * 1000.0) if bw and nbytes else 0.0)

    def collective_s(self, members: tuple[str, ...], payload_values: int, compression: str) -> float:
        t = collective_s(self.cfg, self.model, members, payload_values, compression)
        if not self.faults or len(members) < 2:
            return t
        mset = set(members)
        shard = math.ceil(payload_values / len(members)) * payload_bytes_per_value(compression)
        parts = max(1, math.ceil(shard / self.cfg.wan.chunk_bytes))
        for pairs, _ms, _cap in self.faults.values():
            for a, b in pairs:
                if a in mset and b in mset:
                    phase = self.one_way_s(a, b, shard) + parts * self.model.collective_part_overhead_s
                    t = max(t, 2 * phase + collective_end_s(self.model, len(members)))
        return t
