"""A site's rounds on the virtual clock: compute (H inner steps), the all-reduce rendezvous, the report.

As site_agent/agent.py `_train`: a round starts only if no newer plan takes effect by it; its
samples are ground.schedule's; the collective completes when every member has arrived, plus
the modeled collective time; the round's report (`round_done`, with the cycle timings the
adaptive controller reads) goes to the coordinator; the leader evaluates and checkpoints on the
config's cadence; after the last round the site says `site_done` once its background work ends.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ground.schedule import round_span, site_positions
from ground.setting import step_after_round
from sim.engine import ns
from sim.model import payload_bytes_sent
from site_agent.epochs import interrupts

if TYPE_CHECKING:
    from sim.site import SimSite
    from sim.world import World


class Rounds:
    def __init__(self, w: World) -> None:
        self.w = w
        self.rendezvous: dict[tuple[int, int], dict[str, int]] = {}  # (epoch, round) -> member -> arrival ns
        self._payload: dict[tuple[int, str], tuple[int, int]] = {}

    def start(self, s: SimSite, rnd: int) -> None:
        w, plan = self.w, s.plan
        assert plan is not None
        cfg = w.effective(s.setting)
        n = len(plan.members)
        cs, ce = round_span(cfg, n, plan.start_round, plan.start_cursor, rnd, w.target)
        if cs >= w.target:
            return self.finish(s)
        s.busy, s.inflight = True, rnd
        if interrupts(s.pending, s.epoch, rnd):
            s.log.emit("round_abandoned", round=rnd, reason="a newer epoch takes effect at this round")
            return s._idle()
        s.round = rnd
        step = step_after_round(s.start_step, plan.start_round, rnd, s.setting)
        s.log.set_context(step=step)
        s.snapshots[rnd] = (s.phash, s.retained)
        s.snapshots = {k: v for k, v in s.snapshots.items() if k >= rnd - 3}
        s.next_round = None
        h_steps = cfg.train.inner_steps_h if cfg.train.mode != "sync" else 1
        t_step = w.model.compute_s_per_token * cfg.train.per_site_batch * cfg.model.seq_len
        s.cur = (rnd, cs, ce, h_steps, w.clock.now_ns, t_step)
        w.clock.after(h_steps * t_step, self.computed, s, s.gen, rnd, cs, ce, w.clock.now_ns, h_steps, step)

    def work(self, s: SimSite, rnd: int, cs: int, ce: int, h_steps: int, upto: int) -> list[int]:
        """Log the inner steps 0..upto-1 as `work_attempted`; the site's sample ids of those steps."""
        assert s.plan is not None
        cfg, n, mine = self.w.cfg, len(s.plan.members), []
        idx = self.w.member_index(s.plan.members)[s.name]
        logs = self.w.write_logs
        for h in range(upto):
            ids = site_positions(cfg, n, cs, h, idx, ce)  # sample id = canonical position (no corpus)
            if not ids:
                continue
            if logs:
                tokens = len(ids) * cfg.model.seq_len
                s.log.emit("work_attempted", round=rnd, inner_step=h, samples=list(ids), tokens=tokens,
                           flops=tokens * self.w.flops_per_token)
            mine += ids
        return mine

    def computed(self, s: SimSite, gen: int, rnd: int, cs: int, ce: int, t0: int, h_steps: int, step: int) -> None:
        if gen != s.gen:
            return
        w, plan = self.w, s.plan
        assert plan is not None
        s.cur = None
        mine = self.work(s, rnd, cs, ce, h_steps, h_steps)
        if w.write_logs:
            s.log.span_at("compute", t0, w.clock.now_ns, round=rnd, loss=w.learning.train_loss(ce, h_steps),
                          samples=len(mine), cpu_s=(w.clock.now_ns - t0) / 1e9)
        key = (s.epoch, rnd)
        arrived = self.rendezvous.setdefault(key, {})
        arrived[s.name] = w.clock.now_ns
        s.mine = mine
        s.compute_s = (w.clock.now_ns - t0) / 1e9
        # Every arrival is a member of the plan (the key's epoch): the count says when all are in.
        if len(arrived) == len(plan.members) and set(arrived) == set(plan.members):
            del self.rendezvous[key]
            dur = w.links.collective_s(plan.members, w.n_params, s.setting.compression)
            for m in plan.members:
                site = w.sites[m]
                w.clock.after(dur, self.reduced, site, site.gen, rnd, cs, ce, arrived[m], h_steps, step)

    def reduced(self, s: SimSite, gen: int, rnd: int, cs: int, ce: int, t_arrive: int, h_steps: int,
                step: int) -> None:
        if gen != s.gen:
            return
        w, plan = self.w, s.plan
        assert plan is not None
        sent, parts = self.payload(len(plan.members), s.setting.compression)
        comm_s = (w.clock.now_ns - t_arrive) / 1e9
        if w.write_logs:
            s.log.span_at("collective", t_arrive, w.clock.now_ns, round=rnd, payload_values=w.n_params,
                          payload_bytes_sent=sent, messages_sent=parts, rejected=0, cpu_s=w.model.collective_cpu_s)
        s.phash = w.apply_round(s.phash, rnd, cs, ce)
        s.retained = ce
        s.next_round = rnd + 1
        s.inflight = None
        tokens = len(s.mine) * w.cfg.model.seq_len
        loss = w.learning.train_loss(ce, h_steps)
        cyc = w.model.update_cosine
        cycle = {"compute_s": s.compute_s, "inner_steps": h_steps, "comm_s": comm_s, "payload_bytes": sent,
                 "stalls": 0, "loss": loss, "update_norm": 1.0, "update_dot_mean": cyc * cyc, "mean_norm": cyc}
        s.send("round_done", {"round": rnd, "step": step, "param_hash": s.phash, "cursor_start": cs,
                              "cursor_end": ce, "samples": s.mine, "tokens": tokens,
                              "flops": tokens * w.flops_per_token, "cycle": cycle})
        if w.write_logs:
            s.log.emit("round_done", round=rnd, param_hash=s.phash, cursor_start=cs, cursor_end=ce,
                       retained_samples=ce, samples_sha256=w.prefix_sha(ce))
        last = ce >= w.target
        cfg = w.cfg.train
        if s.leader and ((rnd + 1) % cfg.eval_every_rounds == 0 or last):
            w.learning.evaluate(s, rnd, ce)
        if s.leader and ((rnd + 1) % cfg.checkpoint_every_rounds == 0 or last):
            s.checkpoint(rnd, ce)
        if last:
            return self.finish(s)
        self.start(s, rnd + 1)

    def payload(self, n: int, compression: str) -> tuple[int, int]:
        """(bytes one member sends, message parts) of one all-reduce among n members (kept per n)."""
        key = (n, compression)
        got = self._payload.get(key)
        if got is None:
            w = self.w
            sent = payload_bytes_sent(n, w.n_params, compression)
            parts = 2 * (n - 1) * max(1, math.ceil(sent / max(1, 2 * (n - 1)) / w.cfg.wan.chunk_bytes)) if n > 1 else 0
            got = self._payload[key] = (sent, parts)
        return got

    def abandon(self, s: SimSite) -> None:
        """A newer epoch interrupts the compute: the inner steps begun so far were attempted (and lost)."""
        if s.cur is None:
            return
        rnd, cs, ce, h_steps, t0, t_step = s.cur
        s.cur = None
        done = min(h_steps, math.ceil((self.w.clock.now_ns - t0) / max(1, ns(t_step))))
        self.work(s, rnd, cs, ce, h_steps, done)

    def finish(self, s: SimSite) -> None:
        """The target is reached: after the evaluation and upload in flight, say so."""
        s.busy, s.inflight = False, None
        self.w.clock.at(max(self.w.clock.now_ns, s.eval_until_ns, s.upload_until_ns), self._done, s, s.gen)

    def _done(self, s: SimSite, gen: int) -> None:
        if gen != s.gen:
            return
        s.done_epoch = s.epoch
        s.send("site_done", {"round": s.round})
        s.log.emit("target_reached", epoch=s.epoch, round=s.round)
