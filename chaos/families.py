"""Stress families: seeded generators of fault scenarios, one per kind of stress a WAN run meets.

A family (bandwidth collapse, partition, straggler, ...) is a rule that draws a `Scenario` from a
seed, a severity and the run's target: which site or link is hit, when (by useful tokens, spread
over the run), for how long, and how hard are drawn from the severity's ranges. The same
(family, severity, seed, target, sites) always gives the same scenario (the generator uses its own
`random.Random` seeded from those, never global state), so a study protocol names a family and a
seed instead of hand-writing faults, and its canonical form (and hash) holds the drawn scenario:
a change to a generator changes the protocol's hash, which makes it a new protocol version.

    generate("partition", "severe", seed=30, target_useful_tokens=262_144)

`FAMILIES` lists every family with its description; `SEVERITIES` the two levels. Each drawn
scenario's name says where it came from (`<family>-<severity>-s<seed>`), and its description the
generator's version (`GENERATOR_VERSION`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from chaos.scenario import Scenario

GENERATOR_VERSION = 1
SEVERITIES = ("mild", "severe")
SITES = ("a", "b", "c")
# Faults trigger between these fractions of the target's useful tokens: after the run has warmed
# up and with time left to recover before it ends (a fault past the target never fires).
EARLIEST, LATEST = 0.15, 0.80


@dataclass(frozen=True)
class Draw:
    """One generator call's inputs and its random source."""

    rng: random.Random
    severe: bool
    target: int  # the run's target useful tokens
    sites: tuple[str, ...]

    def pick(self, mild: tuple[float, float], severe: tuple[float, float], ndigits: int = 1) -> float:
        lo, hi = severe if self.severe else mild
        return round(self.rng.uniform(lo, hi), ndigits)

    def count(self, mild: int, severe: int) -> int:
        return severe if self.severe else mild

    def points(self, n: int) -> list[int]:
        """n trigger points in useful tokens, sorted, each in its own slice of [EARLIEST, LATEST] of the target
        (so faults of one scenario do not pile up at one moment unless the family wants them to)."""
        span = (LATEST - EARLIEST) / n
        return [int(self.target * (EARLIEST + span * (i + self.rng.uniform(0.1, 0.9)))) for i in range(n)]

    def site(self) -> str:
        return self.rng.choice(self.sites)

    def link(self) -> str:
        x, y = self.rng.sample(self.sites, 2)
        return f"{min(x, y)}<->{max(x, y)}"


def _thin_link(d: Draw, sc: Scenario) -> Scenario:
    link = d.link()
    for at in d.points(d.count(1, 2)):
        sc = sc.degrade(link, at_useful_tokens=at, duration_s=d.pick((20, 40), (40, 80), 0),
                        bandwidth_kbps=int(d.pick((300, 800), (80, 250), 0)), latency_ms=int(d.pick((40, 80), (80, 160), 0)))
    return sc


def _jitter(d: Draw, sc: Scenario) -> Scenario:
    for at in d.points(d.count(1, 2)):
        sc = sc.degrade(d.link(), at_useful_tokens=at, duration_s=d.pick((20, 40), (40, 80), 0),
                        latency_ms=int(d.pick((30, 60), (60, 120), 0)), jitter_ms=int(d.pick((10, 30), (40, 80), 0)))
    return sc


def _bandwidth_collapse(d: Draw, sc: Scenario) -> Scenario:
    site = d.site()  # every link of one site collapses (its uplink)
    for at in d.points(d.count(1, 2)):
        sc = sc.degrade(site, at_useful_tokens=at, duration_s=d.pick((15, 35), (45, 90), 0),
                        bandwidth_kbps=int(d.pick((150, 400), (40, 120), 0)))
    return sc


def _flapping_link(d: Draw, sc: Scenario) -> Scenario:
    link = d.link()  # one link goes down and up again, again and again
    for at in d.points(d.count(2, 6)):
        sc = sc.reset(link, at_useful_tokens=at, duration_s=d.pick((0.5, 2.5), (1.5, 4.0)))
    return sc


def _partition(d: Draw, sc: Scenario) -> Scenario:
    for at in d.points(d.count(1, 2)):
        sc = sc.blackhole(d.link(), at_useful_tokens=at, duration_s=d.pick((3, 10), (12, 30), 0))
    return sc


def _straggler(d: Draw, sc: Scenario) -> Scenario:
    site = d.site()  # one slow site: it stops for a while, several times
    for at in d.points(d.count(2, 6)):
        sc = sc.hang(site, at_useful_tokens=at, duration_s=d.pick((1.0, 3.0), (2.0, 6.0)))
    return sc


def _preemption_storm(d: Draw, sc: Scenario) -> Scenario:
    n = d.count(1, 4)
    order = [d.sites[i % len(d.sites)] for i in range(d.rng.randrange(len(d.sites)), n + len(d.sites))][:n]
    for site, at in zip(order, d.points(n)):
        sc = sc.preempt(site, at_useful_tokens=at, grace_s=d.pick((2, 5), (1, 3), 0),
                        return_after_s=d.pick((8, 15), (10, 25), 0))
    return sc


def _store_outage(d: Draw, sc: Scenario) -> Scenario:
    for at in d.points(d.count(1, 2)):
        sc = sc.store_outage(mode=d.rng.choice(["stop", "kill"]) if d.severe else "stop", at_useful_tokens=at,
                             duration_s=d.pick((3, 8), (10, 25), 0))
    return sc


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    draw: Callable[[Draw, Scenario], Scenario]


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("thin-link", "one link's bandwidth drops and its latency rises, for a while", _thin_link),
    Family("jitter", "links gain latency and jitter, for a while", _jitter),
    Family("bandwidth-collapse", "every link of one site collapses to a trickle, for a while", _bandwidth_collapse),
    Family("flapping-link", "one link is reset (connections closed) again and again", _flapping_link),
    Family("partition", "a link is blackholed (TCP up, nothing passes), then heals", _partition),
    Family("straggler", "one site stops (SIGSTOP) for seconds, several times", _straggler),
    Family("preemption-storm", "sites are preempted with a short notice, one after another, and come back",
           _preemption_storm),
    Family("store-outage", "the checkpoint store stops (or is killed) and comes back", _store_outage),
)}


class FamilyError(ValueError):
    pass


def generate(family: str, severity: str, *, seed: int, target_useful_tokens: int,
             sites: tuple[str, ...] = SITES) -> Scenario:
    """The scenario `family` draws at `severity` for this seed and target (deterministic)."""
    if family not in FAMILIES:
        raise FamilyError(f"unknown stress family {family!r}; known: {sorted(FAMILIES)}")
    if severity not in SEVERITIES:
        raise FamilyError(f"unknown severity {severity!r}; expected one of {list(SEVERITIES)}")
    if target_useful_tokens <= 0:
        raise FamilyError(f"target_useful_tokens must be > 0, got {target_useful_tokens}")
    if len(sites) < 2:
        raise FamilyError(f"a stress family needs at least two sites, got {list(sites)}")
    rng = random.Random(f"xdc-family/{GENERATOR_VERSION}/{family}/{severity}/{seed}/{target_useful_tokens}/"
                        f"{','.join(sites)}")
    fam = FAMILIES[family]
    sc = Scenario.build(f"{family}-{severity}-s{seed}",
                        f"{fam.description} ({severity}); drawn by chaos.families v{GENERATOR_VERSION}, seed {seed}",
                        seed=seed)
    return fam.draw(Draw(rng, severity == "severe", target_useful_tokens, tuple(sites)), sc)
