"""The recovery plan and the epoch announcement: typed at both ends, encoded and decoded here only.

`Plan` is what the coordinator decides for a new membership epoch (coordinator/recovery.py):
who is in, train or wait, the round and sample cursor to resume from, where state comes from,
and, for the oracle, which site it drains ahead of which fault (`Plan.drain`: a field, never a
phrase in a reason). The coordinator journals `Plan.to_json()` and announces an `EpochPlan`
(the plan plus the epoch, the target and the frontier's manifest) as the body of a `membership`
message; a site decodes that body with `EpochPlan.from_body`, which checks every field and raises
`Rejected` (ground/fields.py) for anything that does not fit.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from dataclasses import field as dataclass_field
from functools import cached_property
from typing import Any

from ground.fields import HEX64, HEX_DIGEST, MAX_INT, NAME, Rejected, field, names, opt_str, req_bool, req_int, show
from ground.setting import MODES, ConsistencySetting, SettingError


class Restore(str, enum.Enum):
    NONE = "none"  # members resume from their own snapshot of `start_round`
    DONOR = "donor"  # joiners receive state from `donor` (peer state transfer)
    STORE = "store"  # everyone loads the durable frontier from the checkpoint store


RESTORES = tuple(r.value for r in Restore)


@dataclass(frozen=True)
class Drain:
    """The oracle drains `site` ahead of its fault, which fires when the commit record reaches `at_cursor`."""

    site: str
    at_cursor: int  # sample positions


@dataclass(frozen=True)
class Plan:
    members: tuple[str, ...]
    paused: bool
    start_round: int
    start_cursor: int  # sample positions
    restore: Restore
    donor: str | None = None
    joiners: tuple[str, ...] = ()
    manifest_hash: str | None = None
    parent_commit: str | None = None  # the commit the next commit descends from (a branch point on restore)
    drain: Drain | None = None  # oracle only: this epoch drains a site ahead of the fault it anticipates
    # The members whose layout the round at start_round was in flight under, when the survivors of a
    # failure take that same round over (elastic/oracle): each keeps the inner steps it already took
    # (ground.schedule.carried_steps). Empty: the round is laid out afresh for `members`.
    carry: tuple[str, ...] = ()
    # The incarnation of each member when the epoch was formed ((site, incarnation), the WAN's
    # per-process id; unknown ones left out): a plan is for those processes only, so a restarted
    # site never adopts one made for its previous incarnation (soak seed 1008). Set by the
    # coordinator when it forms the epoch (coordinator/rules.py), not by the recovery decision.
    # Not part of the decision's identity (compare=False): two plans that decide the same are equal
    # whichever processes they were addressed to.
    incarnations: tuple[tuple[str, int], ...] = dataclass_field(default=(), compare=False)
    # The parameter hash a restore under this plan must produce (SHA-256 hex), from the commit record:
    # the frontier's commit for a store restore, the commit of the round before `start_round` for a
    # donor's state. Set by the coordinator when it forms the epoch (coordinator/rules.py); None when
    # there is nothing to restore or the record does not name it. A restoring site checks against this,
    # never only against the manifest's or the donor's own claim.
    params_hash: str | None = dataclass_field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        """The plan as journaled and as sent to the sites (`drain` is a map {site, at_cursor} or null)."""
        d = asdict(self)
        d["restore"] = self.restore.value
        d["members"], d["joiners"] = list(self.members), list(self.joiners)
        d.pop("carry")
        if self.carry:  # absent unless set: a journal without carries reads as before
            d["carry"] = list(self.carry)
        _put_incarnations(d, self.incarnations)
        if d.get("params_hash") is None:  # absent unless set, as carry
            d.pop("params_hash")
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> Plan:
        """Inverse of to_json, for the coordinator's own journal (a journal written before `drain`
        existed reads as drain=None)."""
        drain = d.get("drain")
        return Plan(members=tuple(d["members"]), paused=bool(d["paused"]), start_round=int(d["start_round"]),
                    start_cursor=int(d["start_cursor"]), restore=Restore(d["restore"]), donor=d.get("donor"),
                    joiners=tuple(d.get("joiners", ())), manifest_hash=d.get("manifest_hash"),
                    parent_commit=d.get("parent_commit"),
                    drain=Drain(str(drain["site"]), int(drain["at_cursor"])) if drain else None,
                    carry=tuple(d.get("carry", ())),
                    incarnations=tuple(sorted((str(k), int(v)) for k, v in (d.get("incarnations") or {}).items())),
                    params_hash=d.get("params_hash"))


@dataclass(frozen=True)
class EpochPlan:
    """One membership epoch as the coordinator announces it (the body of a `membership` message)."""

    epoch: int
    members: tuple[str, ...]  # sorted
    paused: bool
    start_round: int
    start_cursor: int
    restore: Restore
    donor: str | None = None
    joiners: tuple[str, ...] = ()
    manifest_hash: str | None = None
    frontier_manifest: str | None = None
    checkpoint_first: bool = False
    parent_commit: str | None = None
    drain: Drain | None = None
    target_samples: int | None = None
    # The epoch's consistency setting (ground/setting.py; None: a coordinator that sends none, i.e.
    # the run's fixed setting), inner steps before start_round, and the mode of the round before it.
    setting: ConsistencySetting | None = None
    start_step: int | None = None
    prev_mode: str | None = None
    carry: tuple[str, ...] = ()  # Plan.carry
    incarnations: tuple[tuple[str, int], ...] = ()  # Plan.incarnations
    params_hash: str | None = None  # Plan.params_hash: what a restore under this epoch must produce

    def incarnation_of(self, site: str) -> int | None:
        """The incarnation of `site` this plan was made for (None: not named, any incarnation)."""
        return self._incarnation_by_site.get(site)

    @cached_property
    def _incarnation_by_site(self) -> dict[str, int]:
        """site -> the first incarnation `incarnations` names for it; built once per plan (every
        member asks: a scan each was O(N^2) per epoch, 0.1 s a plan at 1,000 sites). Not a field:
        equality, hashing and the body leave it out."""
        out: dict[str, int] = {}
        for s, i in self.incarnations:
            out.setdefault(s, i)
        return out

    @staticmethod
    def announce(epoch: int, plan: Plan, *, target_samples: int, frontier_manifest: str | None,
                 checkpoint_first: bool, setting: ConsistencySetting | None = None, start_step: int | None = None,
                 prev_mode: str | None = None) -> EpochPlan:
        return EpochPlan(epoch=epoch, members=plan.members, paused=plan.paused, start_round=plan.start_round,
                         start_cursor=plan.start_cursor, restore=plan.restore, donor=plan.donor,
                         joiners=plan.joiners, manifest_hash=plan.manifest_hash,
                         frontier_manifest=frontier_manifest, checkpoint_first=checkpoint_first,
                         parent_commit=plan.parent_commit, drain=plan.drain, target_samples=target_samples,
                         setting=setting, start_step=start_step, prev_mode=prev_mode, carry=plan.carry,
                         incarnations=plan.incarnations, params_hash=plan.params_hash)

    def to_body(self) -> dict[str, Any]:
        """The `membership` message body (what `from_body` reads back)."""
        d = asdict(self)
        d["restore"] = self.restore.value
        d["members"], d["joiners"] = list(self.members), list(self.joiners)
        d.pop("carry")
        if self.carry:  # absent unless set: a plan without it reads the same as before
            d["carry"] = list(self.carry)
        _put_incarnations(d, self.incarnations)
        if d.get("params_hash") is None:  # absent unless set: a body without it reads as before
            d.pop("params_hash")
        for k in ("setting", "start_step", "prev_mode"):  # all or none: absent for a fixed-setting coordinator
            d.pop(k)
        if self.setting is not None:
            d.update(setting=self.setting.to_json(), start_step=self.start_step, prev_mode=self.prev_mode)
        return d

    @staticmethod
    def from_body(b: Any, msg_epoch: int, sites: frozenset[str]) -> EpochPlan:
        """Decode and check a `membership` body sent in epoch `msg_epoch`; Rejected with why if it does not fit."""
        what = "membership"
        if not isinstance(b, dict):
            raise Rejected("bad_field", f"{what} body is {type(b).__name__}, expected a map")
        epoch = req_int(b, "epoch", what, lo=1)
        if epoch != msg_epoch:
            raise Rejected("epoch_mismatch", f"membership body epoch {epoch} != message epoch {msg_epoch}")
        members = names(b, "members", what, sites)
        restore = field(b, "restore", what)
        if restore not in RESTORES:  # a tuple: compared by ==, so an unhashable value is simply not one
            raise Rejected("bad_field", f"membership field 'restore' = {show(restore)}, expected one of {list(RESTORES)}")
        target = b.get("target_samples")
        plan = EpochPlan(epoch=epoch, members=members, paused=req_bool(b, "paused", what),
                         start_round=req_int(b, "start_round", what), start_cursor=req_int(b, "start_cursor", what),
                         restore=Restore(restore), donor=opt_str(b, "donor", what, NAME),
                         joiners=names(b, "joiners", what, sites, required=False),
                         manifest_hash=opt_str(b, "manifest_hash", what, HEX64),
                         frontier_manifest=opt_str(b, "frontier_manifest", what, HEX64),
                         checkpoint_first=req_bool(b, "checkpoint_first", what, default=False),
                         parent_commit=opt_str(b, "parent_commit", what), drain=_drain(b.get("drain"), sites),
                         target_samples=None if target is None else req_int(b, "target_samples", what),
                         carry=names(b, "carry", what, sites, required=False),
                         incarnations=_incarnations(b.get("incarnations"), members),
                         params_hash=opt_str(b, "params_hash", what, HEX_DIGEST), **_setting_fields(b, what))
        plan.check()
        return plan

    def check(self) -> None:
        """The plan's fields agree with each other (Rejected "inconsistent_plan" otherwise)."""
        if self.carry and (not set(self.members) <= set(self.carry) or self.restore != Restore.NONE or self.paused):
            raise Rejected("inconsistent_plan", f"epoch {self.epoch}: a carried round needs members {list(self.members)} "
                                                f"among the old members {list(self.carry)}, restore none, no pause")
        if not set(self.joiners) <= set(self.members):
            raise Rejected("inconsistent_plan", f"epoch {self.epoch}: joiners {list(self.joiners)} are not all "
                                                f"members {list(self.members)}")
        if self.restore == Restore.DONOR and not self.paused:
            if self.donor is None or self.donor not in self.members or self.donor in self.joiners:
                raise Rejected("inconsistent_plan", f"epoch {self.epoch}: restore by donor needs a donor among the "
                                                    f"members who is not a joiner; donor {self.donor!r}, members "
                                                    f"{list(self.members)}, joiners {list(self.joiners)}")


def _drain(v: Any, sites: frozenset[str]) -> Drain | None:
    """The optional `drain` map {site, at_cursor} of a membership body."""
    if v is None:
        return None
    if not isinstance(v, dict):
        raise Rejected("bad_field", f"membership field 'drain' must be a map or null, got {show(v)}")
    site = opt_str(v, "site", "membership drain", NAME)
    if site is None or (sites and site not in sites):
        raise Rejected("bad_field", f"membership drain names {show(site)}, not a site of this cluster")
    return Drain(site, req_int(v, "at_cursor", "membership drain", hi=MAX_INT))


def _put_incarnations(d: dict[str, Any], incarnations: tuple[tuple[str, int], ...]) -> None:
    """Journal and message form of Plan.incarnations: a map {member: incarnation}, absent when empty."""
    d.pop("incarnations")
    if incarnations:
        d["incarnations"] = dict(incarnations)


def _incarnations(v: Any, members: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """The optional `incarnations` map {member: incarnation} of a membership body (members only)."""
    if v is None:
        return ()
    if not isinstance(v, dict):
        raise Rejected("bad_field", f"membership field 'incarnations' must be a map or null, got {show(v)}")
    out = []
    for site in v:
        if site not in members:
            raise Rejected("bad_field", f"membership incarnations name {show(site)}, not a member of the epoch")
        out.append((site, req_int(v, site, "membership incarnations", lo=1, hi=MAX_INT)))
    return tuple(sorted(out))


def _setting_fields(b: dict[str, Any], what: str) -> dict[str, Any]:
    """The epoch's consistency setting, start step and previous mode (all or none of them)."""
    if b.get("setting") is None:
        return {}
    try:
        setting = ConsistencySetting.from_json(b["setting"])
    except SettingError as e:
        raise Rejected("bad_field", f"{what} field 'setting': {e}") from None
    prev = field(b, "prev_mode", what)
    if prev not in MODES:
        raise Rejected("bad_field", f"{what} field 'prev_mode' = {show(prev)}, expected one of {list(MODES)}")
    return {"setting": setting, "start_step": req_int(b, "start_step", what), "prev_mode": prev}
