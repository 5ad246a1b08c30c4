"""The simulated checkpoint store, heartbeat sender and learning model.

Store: a leader's background upload takes the modeled write time; then the store logs
`checkpoint_durable` (raising its fence to the writer's epoch first, as checkpoint_store does)
and the site tells the coordinator. Completing an upload or a restore's read is the store's event:
while the store is out (store_outage: stopped, or killed until it starts again) they wait. Heartbeats: every live site sends one every
`heartbeat_period_ms` (the config's interval unless the model coalesces them at scale).
Learning: a prior curve of held-out NLL over useful tokens and H (`prior`, not fitted).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from ground.messages import Built, Heartbeat
from sim.engine import ns
from sim.learning_fit import LearningCurve
from sim.model import checkpoint_blob_bytes, state_bytes

if TYPE_CHECKING:
    from sim.site import SimSite
    from sim.world import World


UPLOAD_BLOCKED_NS = 2**62  # an upload waiting for a cut link to the store: it ends when the link heals


class SimStore:
    def __init__(self, w: World) -> None:
        self.w = w
        self.log = w.log_for("store")
        self.fence = 0
        self.manifests: dict[str, dict[str, Any]] = {}
        self.last_durable: str | None = None

    def start(self) -> None:
        self.log.emit("store_started", removed=[], frontier=None, frontier_error=None, fence_epoch=0,
                      bind="sim", root="sim")

    def write(self, s: SimSite, rnd: int, cursor: int) -> None:
        w, m = self.w, self.w.model
        if w.links.cuts and w.links.is_cut(s.name, "store"):
            # The upload waits for the link (the uploader blocks; an epoch change waits for it).
            s.upload_until_ns = UPLOAD_BLOCKED_NS
            return w.hold((s.name, "store"), self._write_after_cut, (s, s.inc, rnd, cursor))
        nbytes = state_bytes(w.cfg.model, cursor)
        t0 = max(w.clock.now_ns, s.upload_until_ns)  # one upload at a time (the agent's uploader has one thread)
        t1 = t0 + ns(m.checkpoint_fixed_s + nbytes / m.checkpoint_write_bytes_per_s)
        s.upload_until_ns = t1
        w.clock.at(t1, self._durable, s, s.inc, s.epoch, rnd, cursor, s.phash, nbytes, t0)

    def read_done(self, s: SimSite, gen: int, plan: Any, sp: dict[str, Any], t0: int) -> None:
        """A restore's checkpoint read finished (an event of the store's: it waits while the store is stopped)."""
        if gen == s.gen:
            s._restored(plan, sp, t0, self.w.clock.now_ns)

    def stop(self) -> None:
        """store_outage: the store process stops (SIGSTOP) or dies (SIGKILL: its manifests are on disk)."""
        self.w.clock.suspend(self)

    def cont(self, restarted: bool) -> None:
        """The heal: SIGCONT, or (killed) the store started again, reading its manifests back."""
        if restarted:
            self.log.emit("store_started", removed=[], frontier=self.last_durable, frontier_error=None,
                          fence_epoch=self.fence, bind="sim", root="sim")
        self.w.clock.resume(self)

    def _write_after_cut(self, s: SimSite, inc: int, rnd: int, cursor: int) -> None:
        if inc != s.inc or not s.alive:
            return
        s.upload_until_ns = self.w.clock.now_ns
        self.write(s, rnd, cursor)
        waiting, s.upload_waiters = s.upload_waiters, []
        for fn, args in waiting:
            s.after_upload(fn, *args)

    def _durable(self, s: SimSite, inc: int, epoch: int, rnd: int, cursor: int, phash: str, nbytes: int,
                 t0: int) -> None:
        if inc != s.inc or not s.alive:
            return  # the writer died with the upload in flight: nothing became durable
        w = self.w
        if epoch > self.fence:
            self.fence = epoch
            self.log.emit("store_fence_raised", fence_epoch=epoch, src=s.name, kind="ckpt_chunk")
        if epoch < self.fence:
            s.log.emit("checkpoint_failed", round=rnd, reason=f"store fence {self.fence} above epoch {epoch}")
            return
        mh = hashlib.sha256(f"{w.cfg.run_id}:{phash}:{rnd}:{cursor}".encode()).hexdigest()
        ckpt = f"e{epoch}r{rnd}"
        sha = w.prefix_sha(cursor)
        self.manifests[mh] = {"ckpt_id": ckpt, "round": rnd, "cursor": cursor, "params_hash": phash, "bytes": nbytes}
        self.log.emit("checkpoint_durable", epoch=epoch, manifest_hash=mh, ckpt_id=ckpt, round=rnd,
                      parent=self.last_durable, bytes=nbytes, blobs={}, src=s.name)
        self.last_durable = mh
        s.log.span_at("checkpoint_save", t0, w.clock.now_ns, ckpt_id=ckpt, round=rnd, manifest_hash=mh, bytes=nbytes,
                      bytes_uploaded=nbytes)
        if w.wan is not None:
            w.wan.checkpoint_upload(s.name, checkpoint_blob_bytes(w.cfg.model, cursor))
        s.log.span_at("checkpoint_write", t0, w.clock.now_ns, round=rnd, samples_sha256=sha, canonical_sha256=sha,
                      samples=cursor, cursor=cursor, manifest_hash=mh)
        s.send("checkpoint_durable", {"manifest_hash": mh, "round": rnd, "cursor": cursor})


class Heartbeats:
    def __init__(self, w: World) -> None:
        self.w = w
        ms = w.model.heartbeat_period_ms or w.cfg.wan.heartbeat_interval_ms
        self.period_ns = ms * 1_000_000
        self._beat = self._beat_one  # one object: the clock groups its entries by identity
        w.clock.batch(self._beat, self._beat_many)  # (grouped per instant: Clock.at_group)

    def start(self, s: SimSite) -> None:
        self.w.clock.at_group(self.w.clock.now_ns + self.period_ns, self._beat, s, s.gen, s.inc)

    def _beat_one(self, s: SimSite, gen: int, inc: int) -> None:
        self._beat_many([(s, gen, inc)])

    def _beat_many(self, items: list[tuple[SimSite, int, int]]) -> None:
        """The heartbeats of one instant, in order: each live site's message to the coordinator, then
        its next beat (scheduled in that order per site, as one call each would)."""
        w = self.w
        now = w.clock.now_ns
        nxt, beat, logs = now + self.period_ns, self._beat, w.write_logs
        live = [(s, gen, inc) for s, gen, inc in items if s.alive and s.inc == inc]
        if not logs and w.wan is None and not w.coord.down and not w.links.cuts:
            return self._beat_plain(live, now, nxt)
        at_group, to_coord = w.clock.at_group, w.to_coord
        for s, gen, inc in live:
            body = Built(Heartbeat(now, s.epoch, s.round), None,
                         {"sent_mono_ns": now, "epoch": s.epoch, "round": s.round} if logs else None)
            to_coord(s.name, inc, s.epoch, "heartbeat", body)  # typed (see sim/rounds.py)
            at_group(nxt, beat, s, gen, inc)

    def _beat_plain(self, live: list[tuple[SimSite, int, int]], now: int, nxt: int) -> None:
        """_beat_many without logs, byte counters or a cut link (a scale run's every beat), in bulk:
        the messages grouped by their arrival instant and the next beats as one group, which is what
        the clock's groups hold after the per-site calls (sim/engine.Clock.at_group_many), unless an
        arrival falls on the next beat's instant (then the calls are made one by one). The sites of
        one instant in the same epoch and round send equal heartbeats: one immutable typed body."""
        w = self.w
        clock, delay, deliver = w.clock, w.links.one_way_ns, w._deliver
        shared: dict[tuple[int, int], Built] = {}
        arrivals: dict[int, list[tuple[Any, ...]]] = {}
        msgs = []
        for s, _gen, inc in live:
            body = shared.get((s.epoch, s.round))
            if body is None:
                body = shared[(s.epoch, s.round)] = Built(Heartbeat(now, s.epoch, s.round))
            t = now + delay(s.name, "coord")
            msg = (s.name, inc, s.epoch, "heartbeat", body)
            msgs.append((t, msg))
            got = arrivals.get(t)
            if got is None:
                arrivals[t] = [msg]
            else:
                got.append(msg)
        if nxt in arrivals:
            for (t, msg), args in zip(msgs, live):
                clock.at_group(t, deliver, *msg)
                clock.at_group(nxt, self._beat, *args)
            return
        for t, many in arrivals.items():  # (each instant's in order; instants apart do not interact)
            clock.at_group_many(t, deliver, many)
        clock.at_group_many(nxt, self._beat, live)


class Learning:
    """Held-out NLL over useful tokens: the model's learning curve (sim/learning_fit.py), fitted to
    emulator runs by `xdc sim calibrate` (`modeled`) or the prior's guesses (`prior`):

        NLL(T, H) = floor + (start - floor) x (1 + T_eff / scale)^-alpha,   T_eff = T x (1 - p log2 H)
    """

    def __init__(self, w: World | None, curve: LearningCurve | None = None) -> None:
        self.w = w
        self.curve = curve or LearningCurve.from_json(w.model.learning if w is not None else None)
        self.evidence, self.source = self.curve.evidence, self.curve.source
        self._last_loss: tuple[tuple[int, int] | None, float] = (None, 0.0)

    def to_json(self) -> dict[str, Any]:
        return self.curve.to_json()

    def nll(self, tokens: float, h: int = 1) -> float:
        return self.curve.nll(tokens, h)

    def train_loss(self, cursor: int, h: int = 1) -> float:
        if self._last_loss[0] != (cursor, h):  # every member of a round asks for the same one
            self._last_loss = ((cursor, h), round(self.nll(cursor * self.w.cfg.model.seq_len, h), 6))
        return self._last_loss[1]

    def evaluate(self, s: SimSite, rnd: int, cursor: int) -> None:
        t0 = max(self.w.clock.now_ns, s.eval_until_ns)  # the evaluator thread: one evaluation at a time
        t1 = t0 + ns(self.w.model.eval_s)
        s.eval_until_ns = t1
        tokens = cursor * self.w.cfg.model.seq_len
        self.w.clock.at(t1, self._logged, s, s.inc, rnd, tokens, t0, s.setting.steps_per_round)

    def _logged(self, s: SimSite, inc: int, rnd: int, tokens: int, t0: int, h: int) -> None:
        if inc != s.inc or not s.alive:
            return
        s.log.span_at("eval", t0, self.w.clock.now_ns, round=rnd, heldout_nll=self.nll(tokens, h),
                      heldout_nll_se=0.0, eval_set="simulated", eval_tokens=0, eval_cpu_s=self.w.model.eval_s,
                      useful_tokens_trained=tokens, evidence=self.evidence, source=self.source)
