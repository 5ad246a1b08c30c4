"""Held-out evaluation off the round's critical path.

The leader evaluates the held-out NLL after some rounds. Done inline, that evaluation delays the
leader's next round, and every other site then waits for it in the next collective. Here the
leader copies the weights into a private evaluation model (a parameter copy, ~P floats, in the
round loop) and a background thread evaluates the copy (`site_agent.data.eval_fields`) while the next round computes;
the `eval` span is logged from that thread when it ends (EventLog is thread-safe).

The result is the one the inline evaluation gives: the same weights, the same forward, the same
held-out batches, and the thread runs torch with the site's intra-op thread count (OpenMP's
thread count is per OS thread, so it is set again inside the thread). At most one evaluation is in
flight: submitting the next one, or `wait()` (before a site says it is done, and at exit), first
waits for the previous one, so every evaluation the inline code would log is logged.
"""

from __future__ import annotations

import copy
import threading
from typing import Any, Callable

import torch

from ground.eventlog import EventLog


class BackgroundEval:
    """One evaluation thread at a time over a private copy of the model."""

    def __init__(self, model: torch.nn.Module, log: EventLog, threads: int,
                 evaluate: Callable[[torch.nn.Module], dict[str, Any]]) -> None:
        self._source = model  # the live model whose weights `submit` copies
        self.log = log
        self.threads = threads
        self.evaluate = evaluate  # model -> the eval span's fields (heldout_nll in nats/token, its SE, ...)
        self._model = copy.deepcopy(model)  # the evaluation copy: same modules, buffers and tied weights
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def submit(self, rnd: int, fields: dict[str, Any]) -> None:
        """Evaluate the weights the live model holds now (copied before returning); log `eval` when done."""
        self.wait()
        with torch.no_grad():
            for dst, src in zip(self._model.state_dict(keep_vars=True).values(),
                                self._source.state_dict(keep_vars=True).values()):
                dst.copy_(src)
        self._thread = threading.Thread(target=self._run, args=(rnd, dict(fields)), name=f"eval-r{rnd}",
                                        daemon=True)
        self._thread.start()

    def _run(self, rnd: int, fields: dict[str, Any]) -> None:
        torch.set_num_threads(self.threads)  # per OS thread: the same count the inline evaluation used
        try:
            with self.log.span("eval", round=rnd, background=True) as span:
                span.update(self.evaluate(self._model))
                span.update(fields)
        except BaseException as e:  # the span logged it as `error`; the round loop is not disturbed
            self.error = e

    def wait(self) -> None:
        """Block until the evaluation in flight (if any) has been logged."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
