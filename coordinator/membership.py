"""Membership decisions as pure functions: (now, state, config) -> (decision, reason).

The coordinator's loop applies the decision and logs the reason when it changes. Nothing
here reads a clock or a socket, so every rule is tested on a virtual clock.

Two kinds of evidence that a member failed:
  * silence: no heartbeat for `heartbeat_timeout_ms` makes it suspect; `failure_confirm_ms`
    more makes it failed. This is the only evidence for a hung process or a silent
    blackhole, whose TCP connection stays up.
  * a lost connection: the member's connection to the coordinator closed (`disconnected_ns`,
    from the WAN endpoint's socket monitor) and nothing came from it since, for
    `disconnect_grace_ms`. A process that dies closes its connections at once (through
    Toxiproxy too: the proxy closes the downstream side when the upstream side closes), so
    this fails a killed site within the grace instead of the heartbeat timeout. A live site
    whose connection merely closed (a healed blackhole closes the held connections) reconnects
    and heartbeats at once (`wan.monitor`: a reconnected route runs its periodic tasks at once),
    well within the grace: that is no evidence. A link reset that keeps the coordinator's link
    down longer than the grace is indistinguishable from a death from here (both close the
    connection and stay silent), and counts as one: the site is failed and rejoins when its
    link is back (the cost depends on the policy; see the README's failure detection).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from ground.values import builder


class SiteState(str, enum.Enum):
    JOINING = "joining"  # registered, not yet in an epoch
    ACTIVE = "active"  # member of the current epoch, heartbeats on time
    SUSPECT = "suspect"  # heartbeat overdue by more than the timeout
    FAILED = "failed"  # suspicion confirmed (or the site announced its preemption): out of the membership
    DONE = "done"  # finished its work and said so


@dataclass(frozen=True)
class SiteRecord:
    """What the coordinator knows of one site (not the site process: that is site_agent.agent.Site)."""

    name: str
    state: SiteState
    last_heartbeat_ns: int
    incarnation: int = 0
    disconnected_ns: int = 0  # its connection closed then, and nothing was heard since (0: connected)


@dataclass(frozen=True)
class Membership:
    epoch: int = 0
    members: tuple[str, ...] = ()
    sites: dict[str, SiteRecord] = field(default_factory=dict)


@dataclass(frozen=True)
class MembershipConfig:
    expected_sites: tuple[str, ...]
    heartbeat_timeout_ms: int
    failure_confirm_ms: int = 0  # extra silence after suspicion before a site is declared failed
    disconnect_grace_ms: int = 0  # connection closed and nothing since for this long: failed (0: off)


class Action(str, enum.Enum):
    NONE = "none"
    FORM_EPOCH = "form_epoch"  # start a new epoch with `members`
    SUSPECT = "suspect"  # mark `site` suspect (heartbeat overdue)
    CLEAR_SUSPICION = "clear_suspicion"
    CONFIRM_FAILED = "confirm_failed"  # a suspect stayed silent: it has failed
    CONNECTION_LOST = "connection_lost"  # its connection closed and it stayed silent for the grace: failed


@dataclass(frozen=True)
class Decision:
    action: Action
    members: tuple[str, ...] = ()
    site: str = ""


def transition(state: SiteState, event: str) -> SiteState:
    """The site state machine; an event that does not apply leaves the state unchanged."""
    table = {
        (SiteState.JOINING, "admitted"): SiteState.ACTIVE,
        (SiteState.ACTIVE, "heartbeat_overdue"): SiteState.SUSPECT,
        (SiteState.SUSPECT, "heartbeat"): SiteState.ACTIVE,
        (SiteState.ACTIVE, "done"): SiteState.DONE,
        (SiteState.SUSPECT, "done"): SiteState.DONE,
        (SiteState.SUSPECT, "confirmed_failed"): SiteState.FAILED,
        (SiteState.ACTIVE, "connection_lost"): SiteState.FAILED,
        (SiteState.SUSPECT, "connection_lost"): SiteState.FAILED,
        (SiteState.ACTIVE, "announced_failure"): SiteState.FAILED,
        (SiteState.SUSPECT, "announced_failure"): SiteState.FAILED,
        (SiteState.FAILED, "rejoined"): SiteState.JOINING,
        (SiteState.ACTIVE, "removed"): SiteState.JOINING,
    }
    return table.get((state, event), state)


def decide(now_ns: int, m: Membership, cfg: MembershipConfig) -> tuple[Decision, str]:
    """What the coordinator should do next about membership, and why."""
    if m.epoch == 0:
        joined = sorted(s for s in m.sites if s in cfg.expected_sites)
        if tuple(joined) == tuple(sorted(cfg.expected_sites)):
            return Decision(Action.FORM_EPOCH, members=tuple(joined)), f"all {len(joined)} expected sites joined"
        missing = sorted(set(cfg.expected_sites) - set(joined))
        return Decision(Action.NONE), f"waiting for {missing} to join"
    timeout_ns = cfg.heartbeat_timeout_ms * 1_000_000
    grace_ns = cfg.disconnect_grace_ms * 1_000_000
    on_time_ns, active, sites = now_ns - timeout_ns, SiteState.ACTIVE, m.sites
    # The members some rule below may apply to, in member order: the common case (active, heard in
    # time, connected) is passed over in one comprehension (a tick reads every member: at 1,000 sites
    # the loop's per-member `continue` was most of a tick).
    for site in [r for r in map(sites.__getitem__, m.members)
                 if not (r.state is active and r.last_heartbeat_ns >= on_time_ns and not r.disconnected_ns)]:
        name = site.name
        late_ns = now_ns - site.last_heartbeat_ns
        lost_ns = now_ns - site.disconnected_ns if site.disconnected_ns else -1
        if grace_ns > 0 and site.state in (SiteState.ACTIVE, SiteState.SUSPECT) and lost_ns > grace_ns:
            return (Decision(Action.CONNECTION_LOST, site=name),
                    f"{name}: connection closed {lost_ns / 1e6:.0f} ms ago and nothing heard since "
                    f"(grace {cfg.disconnect_grace_ms} ms; last heartbeat {late_ns / 1e6:.0f} ms ago): failed")
        if site.state == SiteState.ACTIVE and late_ns > timeout_ns:
            return (Decision(Action.SUSPECT, site=name),
                    f"{name}: no heartbeat for {late_ns / 1e6:.0f} ms > timeout {cfg.heartbeat_timeout_ms} ms")
        if site.state == SiteState.SUSPECT and late_ns <= timeout_ns:
            return Decision(Action.CLEAR_SUSPICION, site=name), f"{name}: heartbeat resumed"
        if site.state == SiteState.SUSPECT and late_ns > timeout_ns + cfg.failure_confirm_ms * 1_000_000:
            return (Decision(Action.CONFIRM_FAILED, site=name),
                    f"{name}: still no heartbeat after {late_ns / 1e6:.0f} ms: failed")
    return Decision(Action.NONE), "membership stable"


def apply(m: Membership, d: Decision) -> Membership:
    """The state after applying a decision (pure)."""
    sites = dict(m.sites)
    if d.action == Action.FORM_EPOCH:
        for name in d.members:
            sites[name] = replace(sites[name], state=transition(sites[name].state, "admitted"))
        return Membership(epoch=m.epoch + 1, members=d.members, sites=sites)
    if d.action == Action.SUSPECT:
        sites[d.site] = replace(sites[d.site], state=transition(sites[d.site].state, "heartbeat_overdue"))
    elif d.action == Action.CLEAR_SUSPICION:
        sites[d.site] = replace(sites[d.site], state=transition(sites[d.site].state, "heartbeat"))
    elif d.action == Action.CONFIRM_FAILED:
        sites[d.site] = replace(sites[d.site], state=transition(sites[d.site].state, "confirmed_failed"))
    elif d.action == Action.CONNECTION_LOST:
        sites[d.site] = replace(sites[d.site], state=transition(sites[d.site].state, "connection_lost"))
    return replace(m, sites=sites)


SITE_RECORD = builder(SiteRecord)  # SiteRecord(...) with every field given, without the frozen __init__


def heard(site: SiteRecord, now_ns: int, incarnation: int = 0) -> SiteRecord:
    """The record after a heartbeat at `now_ns` (the incarnation learned if given). Built by
    ground.values.builder, not `dataclasses.replace` or the constructor: it runs once per heartbeat,
    millions of times in a simulated hour of 1,000 sites; replace costs five times the constructor,
    the constructor three times the builder (tests/unit/test_membership.py checks that the record is the
    one replace makes, field for field)."""
    return SITE_RECORD(site.name, site.state, now_ns, incarnation or site.incarnation, site.disconnected_ns)


def on_heartbeat(m: Membership, name: str, now_ns: int, incarnation: int = 0) -> Membership:
    if name not in m.sites:
        return m
    sites = dict(m.sites)
    sites[name] = heard(sites[name], now_ns, incarnation)
    return replace(m, sites=sites)


def on_connections(m: Membership, lost: dict[str, int]) -> Membership:
    """The connection evidence: `lost` maps a site to when its connection to us closed, with
    nothing received from it since (the WAN endpoint clears an entry when the site is heard
    again); a site not in it is connected."""
    if lost:
        changed = {n: replace(s, disconnected_ns=lost.get(n, 0)) for n, s in m.sites.items()
                   if s.disconnected_ns != lost.get(n, 0)}
    else:  # nothing lost (every tick of a healthy run): only a site still marked changes
        changed = {n: replace(s, disconnected_ns=0) for n, s in m.sites.items() if s.disconnected_ns}
    return replace(m, sites={**m.sites, **changed}) if changed else m


def on_join(m: Membership, name: str, now_ns: int, incarnation: int) -> Membership:
    """A site asks to join. A new incarnation (restarted process) or a failed site starts over as JOINING."""
    sites = dict(m.sites)
    prev = sites.get(name)
    state = prev.state if prev is not None else SiteState.JOINING
    if prev is not None and (prev.incarnation != incarnation or prev.state == SiteState.FAILED) and m.epoch > 0:
        state = SiteState.JOINING
    sites[name] = SiteRecord(name, state, now_ns, incarnation)
    return replace(m, sites=sites)


def on_done(m: Membership, name: str) -> Membership:
    if name not in m.sites:
        return m
    sites = dict(m.sites)
    sites[name] = replace(sites[name], state=transition(sites[name].state, "done"))
    return replace(m, sites=sites)


def set_state(m: Membership, name: str, event: str) -> Membership:
    """Apply one state-machine event to one site (pure)."""
    if name not in m.sites:
        return m
    sites = dict(m.sites)
    sites[name] = replace(sites[name], state=transition(sites[name].state, event))
    return replace(m, sites=sites)


_MEMBER_SETS: dict[int, tuple[tuple[str, ...], frozenset[str]]] = {}


def member_set(members: tuple[str, ...]) -> frozenset[str]:
    """`members` as a set, memoised by the tuple's identity (the tuple is kept, so its id is never
    reused while cached): `s in members` scans the tuple, O(N) per message at 1,000 sites."""
    got = _MEMBER_SETS.get(id(members))
    if got is None or got[0] is not members:
        if len(_MEMBER_SETS) > 32:
            _MEMBER_SETS.clear()
        got = _MEMBER_SETS[id(members)] = (members, frozenset(members))
    return got[1]
