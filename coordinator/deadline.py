"""The next instant a membership rule could fire, read from the coordinator's state (pure).

A tick before it decides nothing new about membership (coordinator/membership.py `decide`): an
active member turns suspect one ns after its heartbeat timeout, a suspect fails one ns after the
timeout plus `failure_confirm_ms`, a closed connection fails its member one ns after
`disconnect_grace_ms`, and the settling after a restart ends one ns after `settle_until_ns`. The
simulator (sim/coord.py) schedules its ticks there; the service (coordinator/service.py) waits for
messages no longer than until then, so a failure is detected at its deadline, not at the next of
its 50 ms polls (which put a crash's detection 1-47 ms late, and with it which side of a step
boundary the survivors' new epoch landed).
"""

from __future__ import annotations

from coordinator import membership as mb
from coordinator.core_types import CoordState


def silent_since(now_ns: int, mcfg: mb.MembershipConfig) -> int:
    """A member last heard at or before this instant is past its heartbeat timeout at `now_ns`."""
    return now_ns - mcfg.heartbeat_timeout_ms * 1_000_000 - 1


def next_deadline_ns(state: CoordState, mcfg: mb.MembershipConfig, now_ns: int) -> tuple[int | None, bool]:
    """(the earliest membership deadline after `now_ns`, None if there is none; whether the cluster is
    calm: no member suspect or with a closed connection). No deadline before the first epoch (it forms
    on joins, not on time) or after the shutdown."""
    m = state.membership
    if m.epoch == 0 or state.shutdown_sent:
        return None, False
    timeout, confirm, grace = (mcfg.heartbeat_timeout_ms * 1_000_000, mcfg.failure_confirm_ms * 1_000_000,
                               mcfg.disconnect_grace_ms * 1_000_000)
    best = state.settle_until_ns + 1 if state.settle_until_ns > now_ns else None
    active, suspect = mb.SiteState.ACTIVE, mb.SiteState.SUSPECT
    recs = list(map(m.sites.__getitem__, m.members))
    # An active member's silence deadline is last heartbeat + timeout + 1; the earliest one still
    # ahead (> now) is the earliest heartbeat after now - timeout - 1. One pass over the members in
    # comprehensions (the simulator runs this after every tick, at 1,000 sites); the rare suspect or
    # disconnected members after.
    after = silent_since(now_ns, mcfg)
    heard = [r.last_heartbeat_ns for r in recs if r.state is active and r.last_heartbeat_ns > after]
    if heard:
        t = min(heard) + timeout + 1
        if best is None or t < best:
            best = t
    odd = [r for r in recs if r.state is suspect or (r.disconnected_ns and r.state is active)]
    for r in odd:
        cands = []
        if r.state is suspect:
            # Its confirmation may be due already (failure_confirm_ms 0: suspected on one tick, failed on
            # the next): then the next tick is due at once, not after a POLL_S wait.
            cands.append(max(now_ns + 1, r.last_heartbeat_ns + timeout + confirm + 1))
        if grace and r.disconnected_ns:
            cands.append(r.disconnected_ns + grace + 1)
        for t in cands:
            if t > now_ns and (best is None or t < best):
                best = t
    return best, not odd
