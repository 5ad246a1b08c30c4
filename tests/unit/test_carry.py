"""A failure's survivors keep the inner steps they took in the round in flight (issue 9's failover):
the carried layout (ground/schedule.py), the plan that names it, the site's reuse rule
(site_agent/carry.py) and the ledger's crediting of kept steps (analysis/ledgers.py). Pure logic."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from analysis.ledgers import credited_attempts, work_ledger
from coordinator.recovery import ClusterView, Frontier, Plan, Policy, Restore, decide_recovery
from ground.config import load_config
from ground.fields import Rejected
from ground.plans import EpochPlan
from ground.schedule import carried_steps, kept_steps, round_span, site_positions, steps_per_round
from site_agent.adoption import EpochAdoption
from site_agent.carry import MidState, Resume, RoundProgress, reusable_steps
from site_agent.lr_schedule import step_frontier_tokens

SITES = ("a", "b", "c", "d", "e")


def cfg(h: int = 4, tokens: int = 10**6):
    return load_config({"cluster": {"sites": list(SITES)},
                        "train": {"mode": "local", "per_site_batch": 8, "inner_steps_h": h, "target_useful_tokens": tokens}})


def _cases():
    for h in (1, 2, 4):
        for n_old in (2, 3, 5):
            old = SITES[:n_old]
            for k in range(1, n_old):
                for survivors in itertools.combinations(old, k):
                    for cut in (None, 3):  # a full round, and a last round cut at the target
                        yield h, old, survivors, cut


def test_the_carried_layout_covers_the_round_once_and_keeps_each_survivors_steps():
    cfgs = {h: cfg(h) for h in (1, 2, 4)}
    for h, old, survivors, cut in _cases():
        _check_layout(cfgs[h], h, old, survivors, cut)


def _check_layout(c, h, old, survivors, cut):
    b, seq, cs = c.train.per_site_batch, c.model.seq_len, 384
    target = cs + cut * b if cut is not None else 10**6
    _, ce = round_span(c, len(survivors), 4, cs, 4, target)
    _, old_ce = round_span(c, len(old), 4, cs, 4, target)
    layout = carried_steps(c, old, survivors, cs, ce, target)
    covered = [p for s in survivors for r, _f in layout[s] for p in r]
    assert sorted(covered) == list(range(cs, ce))  # every position of the round exactly once
    assert all(len(layout[s]) == h for s in survivors)
    for s in survivors:
        i = old.index(s)
        kept = 0
        for step, (r, front) in enumerate(layout[s]):
            plain = site_positions(c, len(old), cs, step, i, old_ce)
            if r != plain or front * seq != step_frontier_tokens(c, len(old), cs, step, old_ce):
                break
            kept += 1
        # Every old step that lies inside the new round is kept, in order, with its old lr frontier.
        inside = 0
        while inside < h and site_positions(c, len(old), cs, inside, i, old_ce).stop <= ce \
                and len(site_positions(c, len(old), cs, inside, i, old_ce)) == b:
            inside += 1
        assert kept >= inside
        if len(survivors) == len(old) - 1:  # where the site keeps its mid-round copy
            assert kept >= kept_steps(c, len(old), i, cs, old_ce)


def test_the_bench_round_keeps_three_and_two_steps():
    """The recovery bench's case: a, b, c at cursor 384, b fails: a keeps 3 of its 4 steps, c 2."""
    c = cfg(4)
    layout = carried_steps(c, ("a", "b", "c"), ("a", "c"), 384, 448, 10**6)
    assert [(r.start, f) for r, f in layout["a"]] == [(384, 384), (408, 408), (432, 432), (416, 432)]
    assert [(r.start, f) for r, f in layout["c"]] == [(400, 384), (424, 408), (392, 416), (440, 432)]
    assert [kept_steps(c, 3, i, 384, 480) for i in range(3)] == [3, 3, 2]


VIEW = ClusterView(expected=("a", "b", "c"), epoch=1, members=("a", "b", "c"), paused=False, failed=("b",),
                   joiners=(), committed_round=3, committed_cursor=384, frontier=Frontier(3, 384, "f" * 64, "e1r3"),
                   target_samples=10**6, round_samples=96, in_flight_layout=("a", "b", "c"))


def test_elastic_and_oracle_carry_the_round_in_flight_when_its_layout_is_known():
    for pol in (Policy.ELASTIC, Policy.ORACLE):
        plan, why = decide_recovery(VIEW, pol)
        assert plan == Plan(("a", "c"), False, 4, 384, Restore.NONE, carry=("a", "b", "c"))
        assert why.endswith("they keep the inner steps they took in it")
    plan, why = decide_recovery(replace(VIEW, in_flight_layout=()), Policy.ELASTIC)
    assert plan == Plan(("a", "c"), False, 4, 384, Restore.NONE) and "keep" not in why
    plan, _ = decide_recovery(VIEW, Policy.STALL)
    assert plan is not None and plan.paused and plan.carry == ()


def test_a_carried_plan_travels_and_an_inconsistent_one_is_rejected():
    plan = Plan(("a", "c"), False, 4, 384, Restore.NONE, carry=("a", "b", "c"))
    assert Plan.from_json(plan.to_json()) == plan
    body = EpochPlan.announce(2, plan, target_samples=1000, frontier_manifest=None, checkpoint_first=False).to_body()
    got = EpochPlan.from_body(body, 2, frozenset("abc"))
    assert got.carry == ("a", "b", "c") and got.members == ("a", "c")
    plain = EpochPlan.announce(2, replace(plan, carry=()), target_samples=1000, frontier_manifest=None,
                               checkpoint_first=False).to_body()
    assert "carry" not in plain  # a plan without it is the same body as before
    with pytest.raises(Rejected):  # a member that was not in the round's old layout
        EpochPlan.from_body({**body, "carry": ["a", "b"]}, 2, frozenset("abc"))
    with pytest.raises(Rejected):
        EpochPlan.from_body({**body, "restore": "store"}, 2, frozenset("abc"))


def test_reuse_takes_the_matching_prefix_or_the_mid_round_copy_or_nothing():
    wanted = [((1,), 10), ((2,), 20), ((3,), 30), ((4,), 40)]
    p = RoundProgress(4, 384, "local", 4, done=[((1,), 10), ((2,), 20)])
    assert reusable_steps(p, wanted) == (2, False)  # the trainer holds the state right after them
    p.done.append(((9,), 30))  # ran one step past what the new layout keeps
    assert reusable_steps(p, wanted) == (0, False)  # no copy: roll back
    p.mid = MidState(2, [], [], 0)
    assert reusable_steps(p, wanted) == (2, True)
    p.done[1] = ((7,), 20)  # the copy is past the matching prefix: not usable
    assert reusable_steps(p, wanted) == (0, False)


def test_the_mid_round_copy_restores_parameters_and_optimizer_state_exactly():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)

    class T:  # the two trainer attributes MidState touches, on a real module and optimizer
        pass
    t = T()
    t.model, t.inner_opt, t.inner_steps = model, opt, 0

    def step():
        opt.zero_grad()
        model(torch.ones(2, 4)).pow(2).sum().backward()
        opt.step()
        t.inner_steps += 1
    step()
    snap = MidState.take(t, 1)
    want = [p.detach().clone() for p in model.parameters()]
    want_m = [opt.state[p]["exp_avg"].clone() for p in model.parameters()]
    step()
    step()
    snap.restore(t)
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), want))
    assert all(torch.equal(opt.state[p]["exp_avg"], w) for p, w in zip(model.parameters(), want_m))
    assert t.inner_steps == 1


def _attempt(i, epoch, rnd, h, samples, pid=7):
    return {"id": f"a:{i}", "event": "work_attempted", "pid": pid, "epoch": epoch, "round": rnd, "inner_step": h,
            "samples": samples, "tokens": 128 * len(samples), "flops": 1.0, "mono_ns": i}


def test_a_carried_attempt_counts_under_the_epoch_that_committed_it():
    a = [_attempt(1, 1, 4, 0, [10]), _attempt(2, 1, 4, 1, [11]),
         {"id": "a:3", "event": "work_carried", "pid": 7, "epoch": 2, "round": 4, "inner_step": 0, "from_epoch": 1,
          "samples": [10], "tokens": 128, "mono_ns": 3},
         _attempt(4, 2, 4, 1, [12])]
    credited = credited_attempts(a)
    assert [(e["epoch"], e["samples"]) for e in credited] == [(2, [10]), (1, [11]), (2, [12])]
    commits = [{"event": "commit", "commit_id": "e2r4", "parent": None, "epoch": 2, "round": 4, "members": ["a"]}]
    w = work_ledger({"a": credited, "coord": commits}, ["a"], 128)
    site = w["per_site"]["a"]
    # Nothing added or removed: 3 attempts; the carried step and the new one retained, the dropped one lost.
    assert site["attempted_tokens"] == 3 * 128 and site["retained_tokens"] == 2 * 128 and site["lost_tokens"] == 128
    assert w["useful_samples"] == 2


class _AdoptingSite(EpochAdoption):
    """The attributes EpochAdoption.adopt touches, without a trainer: restores record what they load."""

    def __init__(self, c):
        import contextlib
        import numpy as np
        self.cfg, self.me, self.target, self.pool, self.status = c, "a", 10**6, None, {}
        self.step_at_end, self.snapshots, self.retained = {}, {}, np.zeros(0, dtype=np.int64)
        self.events = []
        ev = self.events

        class Log:
            def set_context(self, **kw): pass
            def emit(self, event, **kw): ev.append(event)
            @contextlib.contextmanager
            def span(self, name, **kw):
                yield {}
        self.log = Log()
        self.ckpt = type("C", (), {"wait": lambda s: None})()
        self.node = type("N", (), {"set_fence": lambda s, e: None, "send": lambda s, *a: None})()
        self.allreduce = type("R", (), {"reset": lambda s, e: None, "set_compression": lambda s, c: None})()
        self.loaded = []

    def restore_from_store(self, plan, sp):
        self.loaded.append(("store", plan.epoch))

    def receive_from_donor(self, plan, sp):
        self.loaded.append(("donor", plan.epoch))


@pytest.mark.parametrize("restore", ["store", "donor"])
def test_steps_carried_into_an_abandoned_epoch_are_not_resumed_after_a_restore(restore):
    """Soak seed 1007 (oracle): a carried a step into epoch 3; epoch 3 was abandoned, and in epoch 7 a
    loaded a donor's round-start state but still resumed after the carried step, which the donor's
    state never took (its samples were attested under epoch 7, which never logged them)."""
    site = _AdoptingSite(cfg())
    site.progress = RoundProgress(4, 384, "local", 4, done=[((1,), 10)], epochs=[2], losses=[0.5])
    site.resume, site.next_round = Resume(4, 1, [1], [0.5]), None  # what carry_over left in epoch 3
    r = Restore.STORE if restore == "store" else Restore.DONOR
    plan = Plan(("a", "b"), False, 4, 384, r, donor="b" if restore == "donor" else None,
                joiners=("a",) if restore == "donor" else (), manifest_hash="ab" * 32 if restore == "store" else None)
    body = EpochPlan.announce(7, plan, target_samples=10**6, frontier_manifest=None, checkpoint_first=False).to_body()
    assert site.adopt(EpochPlan.from_body(body, 7, frozenset("ab")))
    assert site.loaded == [(restore, 7)]
    assert site.resume is None and site.progress is None  # round 4 starts from its first step
    assert site.next_round == 4  # the loaded state is round 4's start: a snapshot is taken there


def test_a_donor_that_could_not_roll_back_does_not_serve_a_later_round_of_the_abandoned_lineage(monkeypatch):
    """Soak seed 1008 (oracle): the coordinator was down while the sites trained rounds 1-4 in epoch 1.
    Recovered at the commit of round 0, it resumed at round 1; a, mid-round 5 and holding snapshots of
    rounds 2-5 only, could not roll back (restore_failed). A later epoch made a the donor "at round 2"
    before anyone had retrained round 1, and a sent its round-2 snapshot: a state no commit produced.
    A plan that starts at round 1 abandons every later round's snapshot, whether or not its restore works."""
    from types import SimpleNamespace

    import site_agent.adoption as adoption

    loaded: list[int] = []
    monkeypatch.setattr(adoption, "restore_snapshot", lambda trainer, snap: loaded.append(snap.round))
    site = _AdoptingSite(cfg())
    site.trainer, site.progress, site.resume, site.next_round = None, None, None, None  # mid-round 5
    site.snapshots = {r: SimpleNamespace(round=r, retained=site.retained, params_hash=f"h{r}") for r in (2, 3, 4, 5)}
    sent: list[int] = []
    site.send_to_joiners = lambda plan, sp: sent.append(plan.epoch)

    def adopt(epoch: int, plan: Plan) -> bool:
        body = EpochPlan.announce(epoch, plan, target_samples=10**6, frontier_manifest=None,
                                  checkpoint_first=False).to_body()
        return site.adopt(EpochPlan.from_body(body, epoch, frozenset("abc")))

    with pytest.raises(RuntimeError, match="no snapshot of round 1"):
        adopt(3, Plan(("a",), False, 1, 96, Restore.NONE))
    assert sorted(site.snapshots) == []  # rounds 2-5 belonged to epoch 1's uncommitted rounds
    with pytest.raises(RuntimeError, match="no snapshot of round 2"):
        adopt(4, Plan(("a", "c"), False, 2, 128, Restore.DONOR, donor="a", joiners=("c",)))
    assert sent == [] and loaded == []  # nothing of the abandoned lineage was loaded or served


def test_kept_steps_in_closed_form_is_the_count_of_steps_that_fit() -> None:
    """kept_steps (a closed form: the simulator asks it of every site every round) against its
    definition: count step k while cursor_start + k n b + i b + b <= min(cursor_end, the round of n - 1)."""
    for h in (1, 3, 4, 8):
        c = cfg(h)
        b, steps = c.train.per_site_batch, steps_per_round(c)
        for n in (1, 2, 3, 7):
            for cs in (0, 5, 384):
                for width in (0, 1, b, n * b * steps // 2 + 3, n * b * steps, 10 * n * b * steps):
                    ce = cs + width
                    for i in range(n):
                        end = min(ce, cs + (n - 1) * b * steps)
                        want = 0
                        while want < steps and cs + want * n * b + i * b + b <= end:
                            want += 1
                        assert kept_steps(c, n, i, cs, ce) == want, (h, n, cs, ce, i)
