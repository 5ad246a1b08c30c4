"""The exceptions that unwind a site's loops (site_agent/agent.py): a stop signal, a newer epoch."""

from __future__ import annotations


class Stop(Exception):
    """SIGTERM/SIGINT arrived: leave the loop and exit cleanly."""


class Interrupted(Exception):
    """A newer membership epoch (or a shutdown) arrived: abandon what is in flight."""
