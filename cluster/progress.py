"""Live progress of a run, read from the processes' JSON-lines logs as they grow.

Shows useful tokens committed (against the target), the membership epoch and members, and
each site's current round and last loss, with a rich progress bar, and below it the latest lines
of the run's narration (ground/narrate.py: the words a compose service prints). It reads only the
logs, so it works the same for any launcher.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ground.config import RunConfig
from ground.eventlog import LogTail
from ground.narrate import Narrator
from ground.schedule import target_tokens


class Progress:
    def __init__(self, run_dir: Path, cfg: RunConfig, quiet: bool = False) -> None:
        self.cfg = cfg
        self.quiet = quiet
        self.tails = {p: LogTail(run_dir / "logs" / f"{p}.jsonl") for p in ("coord", *cfg.cluster.sites, "store", "chaos")}
        self.narrator = Narrator()
        self.useful = 0
        self.epoch = 0
        self.members: list[str] = []
        self.sites: dict[str, dict[str, Any]] = {s: {"round": "-", "loss": None, "state": "starting", "tokens": 0}
                                                 for s in cfg.cluster.sites}
        self.nll: float | None = None
        self.notes: list[str] = []
        self.console = Console(stderr=False)
        self.bar = RichProgress(TextColumn("useful tokens"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                console=self.console)
        self.task = self.bar.add_task("useful", total=target_tokens(cfg))
        self.live: Live | None = None

    def __enter__(self) -> "Progress":
        if not self.quiet:
            self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.update(self._render())
            self.live.__exit__(None, None, None)

    def note(self, text: str) -> None:
        self.notes.append(text)
        if self.quiet:
            print(text)

    def update(self) -> None:
        for proc, tail in self.tails.items():
            for ev in tail.read():
                self._apply(proc, ev)
        self.bar.update(self.task, completed=min(self.useful, target_tokens(self.cfg)))
        if self.live is not None:
            self.live.update(self._render())

    def _apply(self, proc: str, ev: dict[str, Any]) -> None:
        line = self.narrator.line(ev)
        if line:
            self.notes.append(line)
        name = ev.get("event")
        if proc not in self.sites and proc != "coord":
            return
        if proc == "coord":
            if name == "commit":
                self.useful = max(self.useful, int(ev.get("useful_tokens", 0)))
            elif name == "membership_epoch":
                self.epoch = int(ev.get("epoch", 0))
                self.members = list(ev.get("members", []))
            return
        site = self.sites[proc]
        if name == "compute":
            site["round"] = ev.get("round")
            site["loss"] = ev.get("loss")
            site["state"] = "training"
        elif name == "work_attempted":
            site["tokens"] += int(ev.get("tokens", 0))
        elif name == "eval":
            self.nll = ev.get("heldout_nll")
        elif name == "site_stopped":
            site["state"] = f"stopped ({ev.get('reason')})"
        elif name == "membership":
            site["state"] = "joined"

    def _render(self) -> Group:
        t = Table(title=f"xdc run {self.cfg.run_id}  mode={self.cfg.train.mode}  epoch={self.epoch} "
                        f"members={','.join(self.members) or '-'}", expand=False)
        for col in ("site", "round", "tokens trained", "train loss", "state"):
            t.add_column(col)
        for s, st in self.sites.items():
            loss = f"{st['loss']:.3f}" if isinstance(st["loss"], (int, float)) else "-"
            t.add_row(s, str(st["round"]), f"{st['tokens']:,}", loss, st["state"])
        extra = f"held-out NLL: {self.nll:.4f}" if self.nll is not None else "held-out NLL: -"
        parts: list[Any] = [t, self.bar, extra, *self.notes[-5:]]
        return Group(*parts)
