"""A site's rounds on the virtual clock: compute (H inner steps), the all-reduce rendezvous, the report.

A round starts only if no newer plan takes effect by it (site_core.epochs `interrupts`); its
samples are ground.schedule's; the collective completes when every member has arrived, plus
the modeled collective time; the round's report (`round_done`, with the cycle timings the
adaptive controller reads) goes to the coordinator; the leader evaluates and checkpoints on the
config's cadence; after the last round the site says `site_done` once its background work ends.

Carried rounds: sim/progress.py (the steps taken in the round in flight, what a carried epoch keeps);
fault gates: sim/gates.py.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ground import gates
from ground.messages import Built, RoundDone
from ground.plans import EpochPlan
from ground.schedule import carried_steps, round_is_whole, round_span, site_round_layout, site_round_positions
from ground.setting import step_after_round
from sim.engine import ns
from sim.model import all_reduce_payload, cycle_extra
from ground.values import builder
from site_core.epochs import interrupts
from sim.gates import GateWaits
from sim.progress import Step, carried, carry_over, new_progress, take_whole

if TYPE_CHECKING:
    from ground.config import RunConfig
    from sim.site import SimSite
    from sim.world import World


ROUND_DONE = builder(RoundDone)  # RoundDone(...): every member's report of every round


class Rounds:
    def __init__(self, w: World) -> None:
        self.w = w
        self.rendezvous: dict[tuple[int, int], dict[str, int]] = {}  # (epoch, round) -> member -> arrival ns
        self.cut_colls: dict[tuple[int, int], tuple[Any, ...]] = {}  # collectives waiting on a cut proxy
        self._carried: dict[tuple[Any, ...], dict[str, list[Step]]] = {}  # the carried layout of the newest plan
        self._round: tuple[Any, ...] = (None,) * 4  # start's newest round (`_round_of`)
        self._setting: tuple[Any, Any] = (None, None)  # _recipe's newest setting and its recipe
        # The members of a round finish their compute and their all-reduce at the same instant: the
        # clock keeps each instant's as one entry (sim/engine.Clock.at_group), run here in order.
        self._computed, self._reduced = self.computed, self.reduced  # one object each: grouped by identity
        w.clock.batch(self._computed, self._computed_many)
        w.clock.batch(self._reduced, self._reduced_many)
        self.gates = GateWaits(w, self.start)  # fault gates (sim/gates.py)

    def _recipe(self, setting: Any) -> tuple[RunConfig, int, bool, float]:
        """(the effective config, inner steps a round, local mode with one worker, s per step) of a
        setting: the same for every member of a round, kept for the newest setting."""
        got = self._setting
        if got[0] is not setting:
            w = self.w
            cfg = w.effective(setting)
            t = cfg.train
            h_steps = t.inner_steps_h if t.mode != "sync" else 1
            t_step = max(w.model.compute_s_per_token * t.per_site_batch * cfg.model.seq_len,
                         t.step_floor_ms / 1000.0)  # the emulated device's floor (train.step_floor_ms)
            got = self._setting = (setting, (cfg, h_steps, t.mode == "local" and t.workers_per_site == 1, t_step))
        return got[1]

    def _round_of(self, s: SimSite, rnd: int) -> tuple[Any, ...]:
        """What every member of round `rnd` of the site's plan shares, in its setting: (plan, round,
        setting, start step, config, H, local with one worker, s per step, members, cursor start, end,
        the cluster's step after the round (None before the plan's start round), carried layout,
        member -> index). Kept for the newest round: a thousand members ask for the same one."""
        plan, setting = s.plan, s.setting
        assert plan is not None
        cfg, h_steps, local, t_step = self._recipe(setting)
        n = len(plan.members)
        cs, ce = round_span(cfg, n, plan.start_round, plan.start_cursor, rnd, self.w.target)
        step = step_after_round(s.start_step, plan.start_round, rnd, setting) if rnd >= plan.start_round else None
        carry = cfg.train.mode == "local" and carried(s, rnd)
        got = self._round = (plan, rnd, setting, s.start_step, cfg, h_steps, local, t_step, n, cs, ce, step, carry,
                             self.w.member_index(plan.members))
        return got

    def start(self, s: SimSite, rnd: int) -> None:
        w = self.w
        r = self._round
        if r[0] is not s.plan or r[1] != rnd or r[3] != s.start_step or not (r[2] is s.setting or r[2] == s.setting):
            r = self._round_of(s, rnd)
        _p, _r, _s, _ss, cfg, h_steps, local, t_step, n, cs, ce, step, carried, index = r
        if cs >= w.target:
            return self.finish(s)
        s.busy, s.inflight = True, rnd
        if s.pending and interrupts(s.pending, s.epoch, rnd):
            s.log.emit("round_abandoned", round=rnd, reason="a newer epoch takes effect at this round")
            return s._idle()
        s.round = rnd
        if step is None:  # a round before its plan's start: step_after_round says why
            step = step_after_round(s.start_step, _p.start_round, rnd, s.setting)
        s.log.set_context(step=step)
        snaps = s.snapshots
        snaps[rnd] = (s.phash, s.retained)
        while (k := min(snaps)) < rnd - 3:  # the last four rounds' snapshots are kept
            del snaps[k]
        s.next_round = None
        idx = index[s.name]
        first = 0
        if s.resume is not None and s.resume[0] == rnd and s.progress is not None:
            first = s.resume[1]  # carried in: the kept steps are taken
        else:
            s.progress = new_progress(rnd, cs, h_steps, None if carried else (cfg, n, idx, cs, ce)) if local \
                else None
        s.resume = None
        layout: list[Step] | tuple[Any, ...]
        if not carried and not first and not w.write_logs and round_is_whole(cfg, n, cs, ce, idx, h_steps):
            # A whole round, no logs (a scale run's every round): the layout's arguments stand for its
            # steps (`work`), which are made only if a carried epoch asks for them (Progress.taken).
            layout, busy = (cfg, n, cs, ce, idx, h_steps), h_steps
        else:
            layout = self._carried_layout(s, cfg, cs, ce, h_steps) if carried else \
                site_round_layout(cfg, n, cs, ce, idx, h_steps)
            # The agent skips a step whose batch is empty (the last round, cut at the target) at no
            # cost: the empty steps trail every layout, so a full last step means none is empty.
            busy = h_steps - first if layout[-1][0] else sum(1 for ids, _f in layout[first:] if ids)
        now = w.clock.now_ns
        s.cur = (rnd, cs, ce, h_steps, now, t_step, first, layout)
        w.clock.at_group(now + ns(busy * t_step), self._computed, s, s.gen, rnd, cs, ce, now, h_steps, step)

    def layout(self, s: SimSite, cfg: RunConfig, rnd: int, n: int, cs: int, ce: int, h_steps: int) -> list[Step]:
        """This site's inner steps of round `rnd` (site_agent.rounds' step_layout, positions for ids)."""
        assert s.plan is not None
        if cfg.train.mode == "local" and carried(s, rnd):
            return self._carried_layout(s, cfg, cs, ce, h_steps)
        idx = self.w.member_index(s.plan.members)[s.name]
        return site_round_layout(cfg, n, cs, ce, idx, h_steps)

    def _carried_layout(self, s: SimSite, cfg: RunConfig, cs: int, ce: int, h_steps: int) -> list[Step]:
        """The site's part of its plan's carried layout (ground.schedule.carried_steps): every member
        computes the same pure layout of the plan; the simulator computes it once per (plan, span,
        recipe) and hands each member its part (O(N) per member, not O(N^2))."""
        assert s.plan is not None
        key = (s.plan.carry, s.plan.members, cs, ce, self.w.target, cfg.train.per_site_batch, h_steps)
        whole = self._carried.get(key)
        if whole is None:
            whole = carried_steps(cfg, s.plan.carry, s.plan.members, cs, ce, self.w.target)
            self._carried = {key: whole}  # one plan at a time: the previous one is done with
        return list(whole[s.name])

    def carry_over(self, s: SimSite, plan: EpochPlan, sp: dict[str, Any]) -> bool:
        """sim/progress.py `carry_over`, with this round's layouts."""
        return carry_over(self.w, s, plan, sp, self.layout)

    def work(self, s: SimSite, rnd: int, layout: list[Step] | tuple[Any, ...], lo: int, hi: int) -> list[int]:
        """Log the inner steps lo..hi-1 of `layout` as `work_attempted` (and record them as taken);
        the site's sample ids of those steps. `layout` may be a whole round's site_round_layout
        arguments (`start`, without logs): the steps are then recorded as Progress.lazy, unmade."""
        if type(layout) is tuple:
            take_whole(s, rnd, layout, lo, hi)
            cfg, n, cs, _ce, idx, _h = layout
            return site_round_positions(cfg, n, cs, idx, lo, hi)
        prog = s.progress if s.progress is not None and s.progress.round == rnd else None
        steps = layout[lo:hi]
        if prog is not None:
            prog.taken()
            prog.done += steps
            prog.epochs += [s.epoch] * len(steps)
        if self.w.write_logs:
            seq = self.w.cfg.model.seq_len
            for h, (ids, _frontier) in enumerate(steps, lo):
                if ids:  # the cut last round: a site's batch of a step may be empty
                    tokens = len(ids) * seq
                    s.log.emit("work_attempted", round=rnd, inner_step=h, samples=list(ids), tokens=tokens,
                               flops=tokens * self.w.flops_per_token)
        out: list[int] = []
        for ids, _frontier in steps:
            out += ids
        return out

    def computed(self, s: SimSite, gen: int, rnd: int, cs: int, ce: int, t0: int, h_steps: int, step: int) -> None:
        if gen != s.gen:
            return
        w, plan = self.w, s.plan
        assert plan is not None
        first, layout = s.cur[6], s.cur[7]
        s.cur = None
        if type(layout) is tuple:
            # A whole round without logs (`start`): its sample ids are never made (see `reduced`).
            take_whole(s, rnd, layout, 0, h_steps)
            mine: list[int] | tuple[()] = ()
            count = h_steps * layout[0].train.per_site_batch
        else:
            mine = self.work(s, rnd, layout, first, h_steps)
            if first:  # carried in: taken in an earlier epoch
                mine = [i for ids, _f in layout[:first] for i in ids] + mine
            count = len(mine)
        if w.write_logs:
            s.log.span_at("compute", t0, w.clock.now_ns, round=rnd, loss=w.learning.train_loss(ce, h_steps),
                          samples=count, cpu_s=(w.clock.now_ns - t0) / 1e9)
        key = (s.epoch, rnd)
        arrived = self.rendezvous.setdefault(key, {})
        arrived[s.name] = w.clock.now_ns
        s.mine, s.n_mine = mine, count
        s.compute_s = (w.clock.now_ns - t0) / 1e9
        self._arrived(s, plan, key, arrived, rnd, cs, ce, h_steps, step)

    def _computed_many(self, items: list[tuple[Any, ...]]) -> None:
        """`computed` for the entries of one instant, in order. The members of a whole round without
        logs (every entry live, of one plan, epoch, round and start: a scale run's every round) in one
        pass that does what the calls would: each member's steps recorded and its arrival; the
        rendezvous can complete only at the last (the members are distinct), so it is looked at once."""
        s0, _g, rnd, _cs, _ce, t0, _h, _st = items[0]
        plan, epoch = s0.plan, s0.epoch
        for s, gen, r, _c, _e, t, _h, _st in items:
            if gen != s.gen or r != rnd or t != t0 or s.plan is not plan or s.epoch != epoch \
                    or type(s.cur[7]) is not tuple:
                for args in items:
                    self.computed(*args)
                return
        assert plan is not None
        now = self.w.clock.now_ns
        key = (epoch, rnd)
        arrived = self.rendezvous.setdefault(key, {})
        compute_s = (now - t0) / 1e9
        cfg, batch = None, 0
        for s, _g, _r, _c, _e, _t, h, _st in items:
            layout = s.cur[7]
            s.cur = None
            prog = s.progress  # take_whole(s, rnd, layout, 0, h), inline (s.epoch is `epoch`)
            if prog is not None and prog.round == rnd:
                if prog.lazy is not None:
                    prog.taken()
                prog.lazy = (layout, 0, h, epoch)
            arrived[s.name] = now
            if layout[0] is not cfg:
                cfg = layout[0]
                batch = cfg.train.per_site_batch
            s.mine, s.n_mine = (), h * batch
            s.compute_s = compute_s
        s, _g, rnd, cs, ce, _t, h, step = items[-1]
        self._arrived(s, plan, key, arrived, rnd, cs, ce, h, step)

    def _arrived(self, s: SimSite, plan: EpochPlan, key: tuple[int, int], arrived: dict[str, int], rnd: int, cs: int,
                 ce: int, h_steps: int, step: int) -> None:
        """After `s`'s arrival at the rendezvous `key`: when every member is in, the all-reduce."""
        w = self.w
        # Every arrival is a member of the plan (the key's epoch): the count says when all are in.
        if len(arrived) == len(plan.members) and set(arrived) == set(plan.members):
            del self.rendezvous[key]
            call = (plan.members, s.setting.compression, arrived, rnd, cs, ce, h_steps, step,
                    {m: w.sites[m].gen for m in plan.members})
            blocked = w.links.cut_into(plan.members)
            if not blocked:
                return self.reduce(call)
            # A cut proxy among the members: nobody completes the all-gather while it lasts. A member
            # that hears nothing from a peer for the stall timeout reports it (site_agent's
            # PeerUnreachable); a heal before that lets the collective finish (`on_heal`).
            self.cut_colls[key] = call
            for m, peers in blocked.items():
                site = w.sites[m]
                w.clock.after(w.cfg.wan.collective_stall_ms / 1000, self.stalled, site, site.gen, key, peers[0])

    def reduce(self, call: tuple[Any, ...], extra_s: float = 0.0) -> None:
        """The all-reduce of a round every member arrived at: each member's `reduced` after it."""
        w = self.w
        members, compression, arrived, rnd, cs, ce, h_steps, step, _gens = call
        dur = extra_s + w.links.collective_s(members, w.n_params, compression)
        sites = w.sites
        w.clock.at_group_many(w.clock.now_ns + ns(dur), self._reduced,  # (one at_group per member, in order)
                              [(sites[m], sites[m].gen, rnd, cs, ce, arrived[m], h_steps, step) for m in members])

    def on_heal(self) -> None:
        """A cut healed: every collective waiting only on cut proxies that pass data again finishes."""
        for key, call in list(self.cut_colls.items()):
            if self.w.links.cut_into(call[0]):
                continue
            del self.cut_colls[key]
            # Only if every member is still in it: one that reported a peer or moved to a newer epoch
            # left it, and the others wait for their newer plan (or their own stall timeout).
            if all(self.w.sites[m].gen == g and self.w.sites[m].alive for m, g in call[-1].items()):
                self.reduce(call, self.w.model.reconnect_s)

    def stalled(self, s: SimSite, gen: int, key: tuple[int, int], peer: str) -> None:
        """Nothing from `peer` for the stall timeout: report it and wait for a newer epoch (the agent's
        `peer_unreachable`, then wait_for_newer_epoch)."""
        if gen != s.gen or key not in self.cut_colls or not s.alive:
            return
        stall_s = self.w.cfg.wan.collective_stall_ms / 1000
        detail = f"round {key[1]} phase rs: nothing from [{peer!r}] for {stall_s:.1f} s"
        s.log.emit("peer_unreachable", peer=peer, detail=detail)
        s.send("peer_unreachable", {"peer": peer, "detail": detail})
        s.gen += 1  # what this round had in flight is void; a newer plan is adopted when it comes
        s.busy, s.inflight = False, None

    def reduced(self, s: SimSite, gen: int, rnd: int, cs: int, ce: int, t_arrive: int, h_steps: int,
                step: int) -> None:
        if gen != s.gen:
            return
        w, plan = self.w, s.plan
        assert plan is not None
        sent, parts = all_reduce_payload(len(plan.members), w.n_params, s.setting.compression,
                                         w.cfg.wan.chunk_bytes)
        comm_s = (w.clock.now_ns - t_arrive) / 1e9
        if w.wan is not None and len(plan.members) > 1:  # an equal share of the parts to every peer
            peers = [m for m in plan.members if m != s.name]
            for p in peers:
                w.wan.payload(s.name, p, "collective", sent // len(peers), parts // len(peers))
        if w.write_logs:
            s.log.span_at("collective", t_arrive, w.clock.now_ns, round=rnd, payload_values=w.n_params,
                          payload_bytes_sent=sent, messages_sent=parts, rejected=0, cpu_s=w.model.collective_cpu_s)
        s.phash = w.apply_round(s.phash, rnd, cs, ce)
        s.retained = ce
        s.next_round = rnd + 1
        s.inflight = None
        s.progress = None  # the round is applied: nothing of it is in flight any more
        tokens = s.n_mine * w.cfg.model.seq_len
        loss = w.learning.train_loss(ce, h_steps)
        # The report, built typed (ground.messages.Built: the core takes it without parsing it again);
        # the map a real site sends is made only for the input log. A whole round without logs reports
        # no sample ids (`computed` never made them): the field is optional, the core reads the cursors,
        # the hash and the counts, and nothing else sees a report of a run without logs.
        flops = tokens * w.flops_per_token
        typed = ROUND_DONE(rnd, step, s.phash, cs, ce, tokens, float(flops), tuple(s.mine))
        extra = self._cycle_of(s.compute_s, h_steps, comm_s, sent, loss)
        raw = None
        if w.write_logs:
            raw = {"round": rnd, "step": step, "param_hash": s.phash, "cursor_start": cs, "cursor_end": ce,
                   "samples": s.mine, "tokens": tokens, "flops": flops, "cycle": extra["cycle"].to_json()}
        s.send("round_done", Built(typed, extra, raw))
        if w.write_logs:
            s.log.emit("round_done", round=rnd, param_hash=s.phash, cursor_start=cs, cursor_end=ce,
                       retained_samples=ce, samples_sha256=w.prefix_sha(ce))
        if w.wan is not None:  # the round's telemetry message (counted, not simulated), the counters
            w.wan.control(s.name, "coord", reliable=False, cls="telemetry")
            w.wan.emit(s.log, s.name, s.pid, final=False)
        last = ce >= w.target
        cfg = w.cfg.train
        if s.leader and ((rnd + 1) % cfg.eval_every_rounds == 0 or last):
            w.learning.evaluate(s, rnd, ce)
        if s.leader and ((rnd + 1) % cfg.checkpoint_every_rounds == 0 or last):
            s.checkpoint(rnd, ce)
        if last:
            return self.finish(s)
        if self.gates.tokens and self.gates.wait(s, rnd, cs, ce):
            return
        self.start(s, rnd + 1)

    def _cycle_of(self, compute_s: float, h_steps: int, comm_s: float, sent: int, loss: float) -> dict[str, Any]:
        """A report's `extra` (sim/model.py `cycle_extra`)."""
        return cycle_extra(compute_s, h_steps, comm_s, sent, loss, self.w.model.update_cosine)

    def _reduced_many(self, items: list[tuple[Any, ...]]) -> None:
        """`reduced` for the entries of one instant, in order. The members of a round without logs or
        byte counters (every entry live, of one plan and setting, one round: a scale run's every round)
        in one pass that does what the calls would, in the same order (each member's report, its
        leader's evaluation and checkpoint, its next round), with what they share worked out once."""
        w = self.w
        s0, _g, rnd, cs, ce, _ta, h_steps, step = items[0]
        plan, setting = s0.plan, s0.setting
        seq = w.cfg.model.seq_len
        plain = not w.write_logs and w.wan is None and not (self.gates.tokens and gates.crossed(self.gates.tokens, cs * seq, ce * seq))
        if plain:
            for s, gen, r, c, e, _ta, h, st in items:
                if gen != s.gen or s.plan is not plan or s.setting is not setting or r != rnd or c != cs \
                        or e != ce or h != h_steps or st != step:
                    plain = False
                    break
        # The members' next round and what stands between them and the coordinator (None: the last
        # round, a cut link, the coordinator down, or a next round not whole): else one by one.
        nxt = self._next_whole(s0, rnd + 1, items) if plain and ce < w.target else None
        if nxt is None:
            for args in items:
                self.reduced(*args)
            return
        assert plan is not None
        sent, _parts = all_reduce_payload(len(plan.members), w.n_params, setting.compression,
                                          w.cfg.wan.chunk_bytes)
        now, apply_round = w.clock.now_ns, w.apply_round
        seq, fpt = w.cfg.model.seq_len, w.flops_per_token
        loss = w.learning.train_loss(ce, h_steps)
        cfg = w.cfg.train  # (not the last round: that one goes one by one)
        evals = (rnd + 1) % cfg.eval_every_rounds == 0
        ckpts = (rnd + 1) % cfg.checkpoint_every_rounds == 0
        cycle_of = self._cycle_of
        # Each member's report and next round as `start` makes them, the calls to the clock collected
        # and made per instant (Clock.at_group_many) before anything else schedules: `_next_whole`
        # checked that no report arrives at the next round's instant, so the groups are the same.
        (_p, r1, _set, start_step, cfg1, h1, local, t_step, n1, cs1, ce1, step1, _carried, index), lat = nxt
        t1 = now + ns(h1 * t_step)
        arrivals: dict[int, list[tuple[Any, ...]]] = {}
        starts: list[tuple[Any, ...]] = []
        clock, deliver, computed = w.clock, w._deliver, self._computed

        def flush() -> None:
            for t, many in arrivals.items():
                clock.at_group_many(t, deliver, many)
            clock.at_group_many(t1, computed, starts)
            arrivals.clear()
            starts.clear()

        timed: tuple[float, int] | None = None  # the last member's (compute s, arrival): its cycle is `extra`
        extra: dict[str, Any] = {}
        # The last report made and what it was made of. Members without sample ids of their own (an
        # unlogged whole round) that hold the same hash, count and cycle send equal reports: one
        # immutable body for all of them, as their heartbeats share one.
        made: tuple[str, int, dict[str, Any]] | None = None
        body = None
        applied: tuple[str | None, str] = (None, "")  # the last member's hash before and after the round
        for (s, _g, _r, _c, _e, t_arrive, _h, _st), d in zip(items, lat):
            if s.phash != applied[0]:  # (the members hold one hash: one call to apply_round a round)
                applied = (s.phash, apply_round(s.phash, rnd, cs, ce))
            s.phash = phash = applied[1]
            s.retained, s.next_round, s.inflight, s.progress = ce, rnd + 1, None, None
            tokens = s.n_mine * seq
            if timed is None or timed[0] != s.compute_s or timed[1] != t_arrive:
                timed = (s.compute_s, t_arrive)
                extra = cycle_of(s.compute_s, h_steps, (now - t_arrive) / 1e9, sent, loss)
            if s.mine or made is None or made[0] != phash or made[1] != tokens or made[2] is not extra:
                typed = ROUND_DONE(rnd, step, phash, cs, ce, tokens, float(tokens * fpt), tuple(s.mine))
                body = Built(typed, extra)
                made = None if s.mine else (phash, tokens, extra)
            msg = (s.name, s.inc, s.epoch, "round_done", body)  # (World.to_coord's, with nothing in the way)
            got = arrivals.get(now + d)
            if got is None:
                arrivals[now + d] = [msg]
            else:
                got.append(msg)
            if s.leader and (evals or ckpts):
                flush()
                if evals:
                    w.learning.evaluate(s, rnd, ce)
                if ckpts:
                    s.checkpoint(rnd, ce)
            if s.pending or s.resume is not None or s.start_step != start_step:
                flush()
                self.start(s, r1)
                continue
            # `start`'s whole round, without logs (its every test made: see _next_whole)
            s.busy, s.inflight, s.round = True, r1, r1
            snaps = s.snapshots
            snaps[r1] = (phash, ce)
            while (k := min(snaps)) < r1 - 3:
                del snaps[k]
            s.next_round = None
            idx = index[s.name]
            s.progress = new_progress(r1, cs1, h1, (cfg1, n1, idx, cs1, ce1)) if local else None
            s.resume = None
            s.cur = (r1, cs1, ce1, h1, now, t_step, 0, (cfg1, n1, cs1, ce1, idx, h1))
            starts.append((s, s.gen, r1, cs1, ce1, now, h1, step1))
        flush()

    def _next_whole(self, s0: SimSite, r1: int,
                    items: list[tuple[Any, ...]]) -> tuple[tuple[Any, ...], list[int]] | None:
        """For `_reduced_many`: the next round's shared values (`_round_of`) and each member's report
        delay to the coordinator, if the members' next round is whole and nothing stands between them
        and the coordinator; else None."""
        w = self.w
        if w.coord.down or w.links.cuts:
            return None
        r = self._round_of(s0, r1)
        _p, _r, _set, _ss, cfg, h, _local, t_step, n, cs, ce, step, carried, _index = r
        # The largest index has the last batch of every step: whole for it, whole for all.
        if cs >= w.target or carried or step is None or not round_is_whole(cfg, n, cs, ce, n - 1, h):
            return None
        delay = w.links.one_way_ns
        lat = [delay(it[0].name, "coord") for it in items]
        if ns(h * t_step) in lat:  # a report would arrive at the next round's instant: one by one
            return None
        return r, lat

    def abandon(self, s: SimSite, killed: bool = False) -> None:
        """The compute stops: the inner steps done so far were attempted (and lost). A newer epoch or a
        SIGTERM is noticed at the next step's start, so the step in progress is finished first (as
        site_agent/rounds.py checks before each step); a SIGKILL ends it unfinished, and the agent logs
        a step's `work_attempted` only once it is done."""
        if s.cur is None:
            return
        rnd, _cs, _ce, h_steps, t0, t_step, first, layout = s.cur
        s.cur = None
        elapsed, per = self.w.clock.now_ns - t0, max(1, ns(t_step))
        done = min(h_steps, first + (elapsed // per if killed else math.ceil(elapsed / per)))
        self.work(s, rnd, layout, first, done)

    def finish(self, s: SimSite) -> None:
        """The target is reached: after the evaluation and upload in flight, say so."""
        s.busy, s.inflight = False, None
        if s.eval_until_ns > s.upload_until_ns:
            self.w.clock.at(max(self.w.clock.now_ns, s.eval_until_ns), self._done, s, s.gen)
        else:
            s.after_upload(self._done, s, s.gen)

    def _done(self, s: SimSite, gen: int) -> None:
        if gen != s.gen:
            return
        s.done_epoch = s.epoch
        s.send("site_done", {"round": s.round})
        s.log.emit("target_reached", epoch=s.epoch, round=s.round)
