"""Membership rules (coordinator/membership.py) on a virtual clock: integers are nanoseconds."""

from __future__ import annotations

import pytest

from coordinator.membership import (
    Action,
    Decision,
    Membership,
    MembershipConfig,
    SiteRecord,
    SiteState,
    apply,
    decide,
    on_done,
    on_heartbeat,
    on_join,
    transition,
)

MS = 1_000_000  # ns per ms
CFG = MembershipConfig(expected_sites=("c", "a", "b"), heartbeat_timeout_ms=3000)
T0 = 1_000 * MS


def joined(*names: str, at: int = T0) -> Membership:
    m = Membership()
    for i, n in enumerate(names):
        m = on_join(m, n, at, incarnation=100 + i)
    return m


def formed(at: int = T0) -> Membership:
    """All three sites joined at `at` and epoch 1 formed."""
    m = joined("b", "c", "a", at=at)
    d, _ = decide(at, m, CFG)
    return apply(m, d)


def suspected_b() -> tuple[Membership, int]:
    m = formed()
    now = T0 + 3001 * MS
    m = on_heartbeat(on_heartbeat(m, "a", now), "c", now)
    d, _ = decide(now, m, CFG)
    assert d == Decision(Action.SUSPECT, site="b")
    return apply(m, d), now


# ---------------------------------------------------------------- forming the first epoch


def test_nobody_joined_waits_for_every_site() -> None:
    assert decide(T0, Membership(), CFG) == (Decision(Action.NONE), "waiting for ['a', 'b', 'c'] to join")


def test_some_sites_joined_waits_naming_the_missing_ones() -> None:
    assert decide(T0, joined("b"), CFG) == (Decision(Action.NONE), "waiting for ['a', 'c'] to join")
    assert decide(T0, joined("c", "a"), CFG) == (Decision(Action.NONE), "waiting for ['b'] to join")


def test_unexpected_site_does_not_count_towards_forming() -> None:
    d, reason = decide(T0, joined("a", "b", "zz"), CFG)
    assert d == Decision(Action.NONE)
    assert reason == "waiting for ['c'] to join"


def test_all_sites_joined_forms_epoch_with_sorted_members() -> None:
    m = joined("c", "a", "b")
    assert decide(T0, m, CFG) == (Decision(Action.FORM_EPOCH, members=("a", "b", "c")), "all 3 expected sites joined")


def test_unexpected_extra_site_is_not_a_member_of_the_formed_epoch() -> None:
    d, _ = decide(T0, joined("c", "zz", "a", "b"), CFG)
    assert d == Decision(Action.FORM_EPOCH, members=("a", "b", "c"))


def test_applying_form_epoch_gives_epoch_1_with_active_members() -> None:
    m = joined("c", "a", "b")
    assert all(s.state == SiteState.JOINING for s in m.sites.values())
    after = apply(m, Decision(Action.FORM_EPOCH, members=("a", "b", "c")))
    assert after.epoch == 1
    assert after.members == ("a", "b", "c")
    assert {n: s.state for n, s in after.sites.items()} == {n: SiteState.ACTIVE for n in "abc"}
    # pure: the input is unchanged
    assert m.epoch == 0 and all(s.state == SiteState.JOINING for s in m.sites.values())


def test_join_records_time_and_incarnation() -> None:
    m = on_join(Membership(), "a", 5 * MS, incarnation=77)
    assert m.sites["a"] == SiteRecord("a", SiteState.JOINING, 5 * MS, 77)


def test_restarted_site_with_new_incarnation_must_be_readmitted() -> None:
    # A new process under an old name has fresh weights: it is a joiner, never an active member.
    m = formed()
    m = on_join(m, "a", T0 + 10 * MS, incarnation=999)
    assert m.sites["a"] == SiteRecord("a", SiteState.JOINING, T0 + 10 * MS, 999)


def test_formed_epoch_with_fresh_heartbeats_is_stable() -> None:
    m = formed()
    assert decide(T0 + 1 * MS, m, CFG) == (Decision(Action.NONE), "membership stable")


# ---------------------------------------------------------------- suspicion


def test_site_silent_exactly_the_timeout_is_not_suspected() -> None:
    m = formed()
    assert decide(T0 + 3000 * MS, m, CFG) == (Decision(Action.NONE), "membership stable")


def test_site_silent_past_timeout_is_suspected() -> None:
    m = formed()
    now = T0 + 4500 * MS
    m = on_heartbeat(on_heartbeat(m, "a", now), "c", now)  # only b is silent
    d, reason = decide(now, m, CFG)
    assert d == Decision(Action.SUSPECT, site="b")
    assert reason == "b: no heartbeat for 4500 ms > timeout 3000 ms"


def test_first_overdue_member_in_member_order_is_suspected_first() -> None:
    m = formed()
    d, reason = decide(T0 + 3001 * MS, m, CFG)
    assert d == Decision(Action.SUSPECT, site="a")
    assert reason == "a: no heartbeat for 3001 ms > timeout 3000 ms"


def test_applying_suspect_marks_only_that_site() -> None:
    m, _ = suspected_b()
    assert m.epoch == 1
    assert {n: s.state for n, s in m.sites.items()} == {
        "a": SiteState.ACTIVE, "b": SiteState.SUSPECT, "c": SiteState.ACTIVE}


def test_suspect_site_still_silent_is_confirmed_failed() -> None:
    m, now = suspected_b()
    d, reason = decide(now + 1 * MS, m, CFG)
    assert d == Decision(Action.CONFIRM_FAILED, site="b")
    assert reason == "b: still no heartbeat after 3002 ms: failed"
    assert apply(m, d).sites["b"].state == SiteState.FAILED


def test_suspect_within_confirmation_window_is_not_failed_yet() -> None:
    cfg = MembershipConfig(expected_sites=("c", "a", "b"), heartbeat_timeout_ms=3000, failure_confirm_ms=500)
    m, now = suspected_b()
    assert decide(now + 1 * MS, m, cfg) == (Decision(Action.NONE), "membership stable")
    assert decide(now + 501 * MS, m, cfg)[0] == Decision(Action.CONFIRM_FAILED, site="b")


def test_heartbeat_after_suspicion_clears_it() -> None:
    m, now = suspected_b()
    m = on_heartbeat(m, "b", now + 10 * MS, incarnation=555)
    assert m.sites["b"].last_heartbeat_ns == now + 10 * MS
    assert m.sites["b"].incarnation == 555
    d, reason = decide(now + 10 * MS, m, CFG)
    assert (d, reason) == (Decision(Action.CLEAR_SUSPICION, site="b"), "b: heartbeat resumed")
    m = apply(m, d)
    assert m.sites["b"].state == SiteState.ACTIVE
    assert m.epoch == 1
    assert decide(now + 10 * MS, m, CFG) == (Decision(Action.NONE), "membership stable")


def test_heartbeat_without_incarnation_keeps_the_known_one() -> None:
    m = formed()
    m = on_heartbeat(m, "a", T0 + 5 * MS)
    assert m.sites["a"].incarnation == 100 + 2  # "a" joined third in formed()


def test_heartbeat_from_unknown_site_is_ignored() -> None:
    m = formed()
    assert on_heartbeat(m, "zz", T0 + 5 * MS) is m


def test_finished_site_is_never_suspected() -> None:
    m = on_done(formed(), "b")
    assert m.sites["b"].state == SiteState.DONE
    now = T0 + 10_000 * MS
    m = on_heartbeat(on_heartbeat(m, "a", now), "c", now)
    assert decide(now, m, CFG) == (Decision(Action.NONE), "membership stable")


def test_done_from_unknown_site_is_ignored() -> None:
    m = formed()
    assert on_done(m, "zz") is m


# ---------------------------------------------------------------- the state table

J, A, S, D = SiteState.JOINING, SiteState.ACTIVE, SiteState.SUSPECT, SiteState.DONE
EVENTS = ("admitted", "heartbeat_overdue", "heartbeat", "done", "bogus")
EXPECTED = {
    (J, "admitted"): A,
    (A, "heartbeat_overdue"): S,
    (S, "heartbeat"): A,
    (A, "done"): D,
    (S, "done"): D,
}


@pytest.mark.parametrize("state", list(SiteState))
@pytest.mark.parametrize("event", EVENTS)
def test_transition_table(state: SiteState, event: str) -> None:
    assert transition(state, event) == EXPECTED.get((state, event), state)


@pytest.mark.parametrize("state,event", [(J, "heartbeat_overdue"), (J, "done"), (A, "admitted"), (A, "heartbeat"),
                                         (S, "admitted"), (D, "heartbeat"), (D, "admitted"), (D, "done")])
def test_events_that_do_not_apply_leave_state_unchanged(state: SiteState, event: str) -> None:
    assert transition(state, event) is state


def test_decision_none_changes_nothing() -> None:
    m = formed()
    assert apply(m, Decision(Action.NONE)) == m


def test_a_heartbeat_record_built_by_hand_equals_dataclasses_replace_on_every_field() -> None:
    """membership.heard builds the record with ground.values.builder (speed); it must say what replace
    says, including on a field added later (then the builder call misses it and this fails)."""
    from dataclasses import fields, replace

    from coordinator.membership import SiteRecord, SiteState, heard

    site = SiteRecord("b", SiteState.SUSPECT, 5, incarnation=3, disconnected_ns=7)
    assert [f.name for f in fields(SiteRecord)] == ["name", "state", "last_heartbeat_ns", "incarnation",
                                                   "disconnected_ns"]
    assert heard(site, 9) == replace(site, last_heartbeat_ns=9)
    assert heard(replace(site, incarnation=0), 9, 4) == replace(site, last_heartbeat_ns=9, incarnation=4)
    assert heard(site, 9, 4) == replace(site, last_heartbeat_ns=9, incarnation=4)  # as on_heartbeat: a given one wins
