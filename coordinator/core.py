"""The coordinator's rules as a pure core: (state, input, now, config) -> (new state, outputs).

Everything the coordinator decides lives here: who is a member of which epoch, when a round
commits, which recovery plan a failure gets, when the run is complete. Nothing here touches a
socket, a file or the clock: `now_ns` is an argument, inputs are values, and the outputs are an
ordered list of what the shell (`coordinator/service.py`) must do, in that order:

    Journal(record)        append to the durable journal (before anyone is told: commits, epochs)
    Emit(event, fields)    one structured log line (the decision and its reason)
    Send(to, kind, body)   a control message (a plan: the `membership` body; or `shutdown`)
    Fence(epoch)           the WAN endpoint drops messages of epochs below this
    Context(fields)        the log's context (epoch, step) for the lines after it

Inputs are `Received` (a message from a site: header fields and its raw body, parsed and checked
here), `Messages` (many sites' messages of one kind at one instant: the same as one Received each, in
one input; the simulator's) and `Tick` (the connections the WAN endpoint saw close, then the membership
and recovery decisions and the completion check). `recover` rebuilds the state from the journal's records.

The state is a frozen dataclass; `step` works on a private copy (`rules.Rules`) and returns a new
state, so the same inputs at the same `now_ns` give the same decisions: a run's logged inputs
(the coordinator logs each as `coord_input`) replay through this core to its logged decisions.
"""

from __future__ import annotations

from typing import Any

from coordinator.core_types import (EVENTS, KINDS, RECEIVED, Context, CoordState, Emit, Fence, Journal, Messages,
                                    Output, Received, Send, Tick, membership_config, policy_of)
from coordinator.recovery import ClusterView, OracleFaults, Policy
from coordinator import restart
from coordinator.rules import Rules
from coordinator.settings import EpochSettings
from ground.config import RunConfig
from ground.schedule import samples_for_tokens, target_samples

__all__ = ["EVENTS", "KINDS", "RECEIVED", "Context", "CoordState", "Emit", "Fence", "Input", "Journal", "Messages",
           "Output", "Received", "Send", "Tick", "announce_current", "initial_state", "membership_config", "policy_of", "recover",
           "step", "step_all", "target_samples", "view"]


def initial_state(cfg: RunConfig) -> CoordState:
    """A coordinator that has heard nothing yet (the oracle's faults converted to sample cursors)."""
    faults = tuple((site, samples_for_tokens(cfg, tokens)) for site, tokens in cfg.recovery.oracle_faults)
    return CoordState(oracle=OracleFaults(faults if policy_of(cfg) == Policy.ORACLE else ()),
                      settings=EpochSettings(cfg))


Input = Received | Messages | Tick


def _apply(w: Rules, event: Input, now_ns: int) -> None:
    if isinstance(event, Received):
        w.handle(event, now_ns)
    elif isinstance(event, Messages):
        w.messages(event, now_ns)
    else:
        w.tick(event, now_ns)


def step(state: CoordState, event: Input, now_ns: int, cfg: RunConfig) -> tuple[CoordState, list[Output]]:
    """Apply one input at `now_ns`: the new state and what to do, in order."""
    w = Rules(state, cfg)
    _apply(w, event, now_ns)
    return w.freeze(), w.out


def step_all(state: CoordState, events: list[Input], now_ns: int,
             cfg: RunConfig) -> tuple[CoordState, list[list[Output]]]:
    """Several inputs at the same `now_ns`, in order: the state and the outputs (one list per input)
    that calling `step` once per input gives, with one working copy for all of them. The simulator
    hands it the messages of one instant (a thousand heartbeats or round reports at 1,000 sites);
    `step` copies the state per input, which is what made a simulated step cost O(N)."""
    w = Rules(state, cfg)
    outs: list[list[Output]] = []
    for event in events:
        w.out = []
        _apply(w, event, now_ns)
        outs.append(w.out)
    return w.freeze(), outs


def recover(records: list[dict[str, Any]], problem: str | None, now_ns: int,
            cfg: RunConfig, logged_epochs: frozenset[int] | None = None) -> tuple[CoordState, list[Output]]:
    """The state a restarted coordinator rebuilds from its journal's records (`problem`: a torn tail;
    `logged_epochs`: the epochs its log announced before the restart, None if unknown)."""
    w = Rules(initial_state(cfg), cfg)
    restart.recover(w, records, problem, now_ns, logged_epochs)
    return w.freeze(), w.out


def view(state: CoordState, cfg: RunConfig) -> ClusterView:
    """The cluster as the recovery policies see it (coordinator/recovery.py)."""
    return Rules(state, cfg).view()


def announce_current(state: CoordState, cfg: RunConfig) -> list[Output]:
    """The current epoch's plan sent again to its members (a restarted coordinator re-announces it)."""
    w = Rules(state, cfg)
    w.send_plan(list(state.membership.members))
    return w.out
