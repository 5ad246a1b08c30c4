"""One piece of work at a time in a background thread, its failure re-raised where it is awaited.

The leader's periodic checkpoint upload runs here while the next round computes (site_agent.agent):
`start` first waits for the previous job, so jobs run in the order they were started and never
overlap; `wait` blocks until the job in flight has finished and raises what it raised, in the
caller's thread, so a failure the inline code would have raised is raised all the same (later).
"""

from __future__ import annotations

import threading
from typing import Callable


class OneAtATime:
    def __init__(self, name: str) -> None:
        self.name = name
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, job: Callable[[], None]) -> None:
        """Run `job` in a new thread once the previous job has finished (re-raising its failure)."""
        self.wait()

        def _run() -> None:
            try:
                job()
            except BaseException as e:  # handed to wait()
                self._error = e

        self._thread = threading.Thread(target=_run, name=self.name, daemon=True)
        self._thread.start()

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Block until the job in flight (if any) is done; raise what it raised."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        err, self._error = self._error, None
        if err is not None:
            raise err
