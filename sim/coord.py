"""The coordinator on the virtual clock: the same shell as coordinator/service.py around the same core.

Each message is one `core.step(Received)` (without logs, each run of one kind's messages of an
instant after its first is one `core.Messages`, the same as a Received each); after the messages
of one instant, one `core.step(Tick)` with the connections the WAN endpoint would have seen close.
Ticks also run at the next instant a membership rule could fire (a heartbeat timeout, a
confirmation, a disconnect grace), read from the core's state, instead of every 50 ms. An instant
of nothing but heartbeats in a calm cluster gets no tick, nor does a deadline heartbeats put off:
they would decide nothing (see `_needs_tick`). The outputs are carried out in order, as the
service does: the journal, the log line, the send (delivered after the link's latency), the log
context. Every input is logged as `coord_input`, as the service does, so a simulated run replays
through the core like an emulated one.
"""

from __future__ import annotations

import time
from itertools import groupby
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from coordinator import core
from coordinator import membership as mb
from coordinator.deadline import next_deadline_ns, silent_since
from ground.journal import Journal
from ground.messages import Built

if TYPE_CHECKING:
    from sim.world import World

INPUT_EVENT = "coord_input"
KIND = itemgetter(3)  # a message's kind: (src, inc, epoch, kind, body)


class SimCoordinator:
    def __init__(self, w: World) -> None:
        self.w, self.cfg = w, w.cfg
        self.log = w.log_for("coord")
        self.state = core.initial_state(self.cfg)
        self.journal = Journal(w.run_dir / "coordinator" / "journal.jsonl") if w.run_dir is not None else None
        self.lost: dict[str, int] = {}
        self.tick_due = False
        self.deadline_ns = -1
        self.mcfg = core.membership_config(self.cfg)
        self.log_inputs = w.write_logs
        self.core_steps, self.core_ns = 0, 0  # messages and ticks it handled, and its time in ns (the scale bench)
        self.core_by_kind: dict[str, list[int]] = {}  # message kind ("tick" for ticks) -> [inputs, ns in the core]
        self.records: list[dict[str, Any]] = []  # the journal's records (what a restart recovers from)
        self.down = False  # killed (coord_crash) until it starts again
        self.gen = 0  # its scheduled ticks belong to one incarnation
        # The last core input was a tick that decided nothing (or heartbeats after one that needed no
        # tick), and no member was suspect or disconnected then: see `_needs_tick`.
        self.settled = self.calm = False

    def _step(self, event: core.Received | core.Tick, now: int) -> list[core.Output]:
        return self._step_all([event], now)[0]

    def _step_all(self, events: list[core.Input], now: int) -> list[list[core.Output]]:
        """One core.step_all per run of consecutive inputs of one kind (the same as one step each), so
        that the core's time is known per message kind (`core_by_kind`: the scale bench's floor). Counts
        are of messages (a core.Messages input counts each of its messages) and ticks."""
        outs: list[list[core.Output]] = []
        i, n = 0, len(events)
        kinds = [getattr(e, "kind", "tick") for e in events]
        batch = core.Messages
        while i < n:
            kind = kinds[i]
            j = i + 1
            while j < n and kinds[j] == kind:
                j += 1
            t0 = time.perf_counter_ns()
            self.state, got = core.step_all(self.state, events[i:j], now, self.cfg)
            dt = time.perf_counter_ns() - t0
            count = sum(len(e.messages) if type(e) is batch else 1 for e in events[i:j])
            acc = self.core_by_kind.get(kind)
            if acc is None:
                acc = self.core_by_kind[kind] = [0, 0]
            acc[0] += count
            acc[1] += dt
            self.core_ns += dt
            self.core_steps += count
            outs += got
            i = j
        return outs

    def start(self) -> None:
        self.log.emit("coordinator_started", expected_sites=list(self.mcfg.expected_sites),
                      policy=self.cfg.recovery.policy, journal_commits=0, target_samples=self.w.target)
        self.request_tick()

    def crash(self) -> None:
        """coord_crash: SIGKILL. Its timers die with it; what the sites send meanwhile waits in their
        queues (sim/world.py holds it) and reaches the next incarnation."""
        self.down, self.gen, self.settled = True, self.gen + 1, False
        self.tick_due, self.deadline_ns, self.lost = False, -1, {}  # (a SIGKILLed process logs nothing)

    def restart(self) -> None:
        """Started again: the state is rebuilt from the journal by the core's own `recover`, the
        current epoch is announced again (as coordinator/service.py does), and what waited arrives."""
        now = self.w.clock.now_ns
        self.down, self.gen, self.settled = False, self.gen + 1, False
        self.state, outs = core.recover(list(self.records), None, now, self.cfg)
        self.log.emit("coordinator_started", expected_sites=list(self.mcfg.expected_sites),
                      policy=self.cfg.recovery.policy, journal_commits=len(self.state.commits),
                      target_samples=self.w.target)
        self._apply(outs, journal=False)
        if self.state.membership.epoch > 0:
            self._apply(core.announce_current(self.state, self.cfg))
        self.w.release()
        self.request_tick()

    # ------------------------------------------------------------------ inputs
    def receive(self, src: str, inc: int, epoch: int, kind: str, body: Any) -> None:
        self.receive_all([(src, inc, epoch, kind, body)])

    def receive_all(self, msgs: list[tuple[str, int, int, str, Any]]) -> None:
        """Messages of one instant (src, inc, epoch, kind, body), in arrival order: one core step for
        all (core.step_all: the same as one step each), then each one's outputs carried out and the
        input logged in that order, as one `receive` each would have (nothing the outputs do reaches
        the core within the instant: sends and faults are scheduled on the clock)."""
        now = self.w.clock.now_ns
        heard_lost = False
        if self.lost:
            for m in msgs:  # heard again: the WAN endpoint clears the closed connection
                heard_lost = self.lost.pop(m[0], None) is not None or heard_lost
        if not self.log_inputs:
            return self._receive_plain(msgs, now, heard_lost)
        outs = self._step_all([core.RECEIVED(*m) for m in msgs], now)
        tick = self._needs_tick(list(map(KIND, msgs)), outs, now, heard_lost)
        for m, out in zip(msgs, outs):
            if out:
                self._apply(out)
            src, inc, epoch, kind, body = m
            rejected = any(isinstance(o, core.Emit) and o.event == "report_rejected" for o in out)
            if type(body) is Built:
                body = body.raw  # the map a real site would have sent (the core took it typed)
            self.log.emit(INPUT_EVENT, input="message", now_ns=now, src=src, inc=inc, msg_epoch=epoch,
                          kind=kind, **({"rejected": True} if rejected else {"body": body}))
            if tick and not self.tick_due:  # (request_tick's own first test: a thousand reports, one tick)
                self.request_tick()

    def _needs_tick(self, kinds: list[str], outs: list[list[core.Output]], now: int, heard_lost: bool) -> bool:
        """Whether the messages of this instant (`kinds`: their kinds, in order) need a tick after them.
        Not when they are all heartbeats that asked for nothing (no output), none from a site whose
        connection was marked closed, and
        the last core input before them was a tick that decided nothing (or heartbeats like these),
        with no member suspect or disconnected and the next membership deadline still ahead. Such a
        tick would decide nothing either: heartbeats change only when sites were last heard (which
        clears nothing: nobody is suspect), no rule's deadline has passed since (the deadline tick is
        scheduled for the first), and everything else a tick reads (states, members, the commit record,
        the setting) is what the last tick read. Nor would it move the deadline (heartbeats only make
        it later, and a later one is not rescheduled). tests/unit/test_sim.py runs with and without this."""
        if self.settled and self.calm and not heard_lost and self.deadline_ns > now and not any(outs) \
                and kinds.count("heartbeat") == len(kinds):
            return False
        self.settled = False
        return True

    def _receive_plain(self, msgs: list[tuple[str, int, int, str, Any]], now: int, heard_lost: bool) -> None:
        """receive_all without an input log: each run of messages of one kind after the first message is
        one core.Messages input (the same as one Received each), and each input's outputs are carried
        out in order, a tick requested after the first message as one `receive` each would (after it the
        tick is due: the later requests did nothing)."""
        events: list[core.Input] = [core.RECEIVED(*msgs[0])]
        events += [core.Messages(kind, tuple(run)) for kind, run in groupby(msgs[1:], key=KIND)]
        outs = self._step_all(events, now)
        tick = self._needs_tick(list(map(KIND, msgs)), outs, now, heard_lost)
        for out in outs:
            if out:
                self._apply(out)
            if tick and not self.tick_due:
                self.request_tick()

    def connection_lost(self, site: str) -> None:
        """The site's process died: its connection to us closes (seen after the link's latency)."""
        gen = self.gen

        def closed() -> None:
            if gen != self.gen or self.down:
                return  # the coordinator died meanwhile: its next incarnation never had that connection
            self.lost[site] = self.w.clock.now_ns
            self.log.emit("peer_disconnected", peer=site, link=f"{site}_to_coord", fd=-1)
            self.request_tick()
        self.w.clock.after(self.w.latency_s(site, "coord"), closed)

    def request_tick(self) -> None:
        if not self.tick_due and not self.down:
            self.tick_due = True
            self.w.clock.at(self.w.clock.now_ns, self._tick, self.gen)

    def _tick(self, gen: int) -> None:
        if gen != self.gen:
            return
        self.tick_due = False
        now = self.w.clock.now_ns
        before = self.state
        event = core.Tick(tuple(sorted(self.lost.items())))
        out = self._step(event, now)
        self.settled = not out
        self._apply(out)
        if self.log_inputs and (out or self.state != before):
            self.log.emit(INPUT_EVENT, input="tick", now_ns=now, lost=dict(event.lost))
        if out:
            self.request_tick()  # as the service's loop: the next pass sees the new state
        self._schedule_deadline(now)

    def _schedule_deadline(self, now: int) -> None:
        """A tick at the next instant a membership rule could fire, from the core's state."""
        best, self.calm = next_deadline_ns(self.state, self.mcfg, now)
        if best is not None and (self.deadline_ns <= now or best < self.deadline_ns):
            self.deadline_ns = best
            self.w.clock.at(best, self._deadline_tick, best, self.gen)

    def _deadline_tick(self, t: int, gen: int) -> None:
        if gen != self.gen:
            return
        if t == self.deadline_ns:
            self.deadline_ns = -1
        if self.settled and self.calm and not self.tick_due and not self.state.settle_until_ns \
                and not self._late(t):
            # Heartbeats since it was scheduled put it off: nothing is due, and the tick would decide
            # nothing (see `_needs_tick`) but the next deadline, which is set here as it would.
            self._schedule_deadline(t)
            return
        self.request_tick()

    def _late(self, now: int) -> bool:
        """Whether an active member's heartbeat timeout has run out by `now`."""
        m, active = self.state.membership, mb.SiteState.ACTIVE
        after = silent_since(now, self.mcfg)
        return any(r.last_heartbeat_ns <= after for r in map(m.sites.__getitem__, m.members) if r.state is active)

    # ------------------------------------------------------------------ outputs
    def _apply(self, outputs: list[core.Output], journal: bool = True) -> None:
        for o in outputs:
            if isinstance(o, core.Journal):
                if not journal:
                    continue
                self.records.append(o.record)
                if self.journal is not None:
                    self.journal.append(o.record)
            elif isinstance(o, core.Emit):
                self.log.emit(o.event, **o.fields)
                if o.event == "commit":
                    self.w.chaos.on_commit(o.fields)
                elif o.event == "membership_epoch":
                    self.w.chaos.on_epoch_one()
            elif isinstance(o, core.Send):
                self.w.to_site(o.to, o.kind, o.body, o.epoch)
            elif isinstance(o, core.Context):
                self.log.set_context(**o.fields)
            # core.Fence: the WAN endpoint's fence; simulated sites never send a stale epoch's
            # collective to the coordinator, so there is nothing for it to drop here.

    def close(self) -> None:
        self.log.emit("coordinator_stopped", reason="shutdown" if self.state.shutdown_sent else "end of simulation")
        if self.journal is not None:
            self.journal.close()
