"""The toxiproxy-server child process: find the binary, start it on a free port, wait until it
answers, stop it (SIGTERM, then SIGKILL), and never leave it running after its owner is gone."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any

from wan.toxiproxy_client import ToxiproxyClient, ToxiproxyError

INSTALL_HINT = (
    "run `make setup`, or `go install github.com/Shopify/toxiproxy/v2/cmd/server@v2.12.0` "
    "and put the binary on PATH as toxiproxy-server"
)


def _ephemeral_low(default: int = 32768) -> int:
    """The lowest port the kernel hands out for outgoing connections (Linux; else the usual default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, chosen below the kernel's ephemeral range.

    A port from the ephemeral range (what binding port 0 returns) can be taken, between this call
    and the bind that uses it, by any outgoing connection on the machine -- a loaded test run saw
    "Address already in use" that way. A port below the range is never handed out by the kernel, so
    only another explicit bind can take it; the choice is random to make that unlikely too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    low = _ephemeral_low()
    span = (max(10_000, low - 20_000), low) if low > 11_000 else None
    rng = random.SystemRandom()
    for _ in range(200 if span else 0):
        port = rng.randrange(*span)
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(family, socket.SOCK_STREAM) as s:  # no room below the range: the kernel's choice
        s.bind((host, 0))
        return int(s.getsockname()[1])


def find_toxiproxy_binary() -> str:
    """$XDC_TOXIPROXY, else `toxiproxy-server` next to sys.executable (the venv's bin), else on PATH."""
    env = os.environ.get("XDC_TOXIPROXY")
    if env:
        if os.path.isfile(env) and os.access(env, os.X_OK):
            return env
        raise FileNotFoundError(f"XDC_TOXIPROXY={env!r} is not an executable file; {INSTALL_HINT}")
    beside = Path(sys.executable).parent / "toxiproxy-server"  # not resolved: keep the venv's bin
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    on_path = shutil.which("toxiproxy-server")
    if on_path:
        return on_path
    raise FileNotFoundError(
        f"toxiproxy-server not found (checked $XDC_TOXIPROXY, {beside.parent}, PATH); {INSTALL_HINT}"
    )


class _ExitedEarly(ToxiproxyError):
    pass


def _terminate(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace_s)
    except ProcessLookupError:
        pass


class ToxiproxyServer:
    """Runs the real toxiproxy-server binary as a child process (with -proxy-metrics).

        with ToxiproxyServer() as srv:
            srv.client.create_proxy(...)
    """

    def __init__(
        self,
        binary: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        log_path: Path | None = None,
    ) -> None:
        self.binary = binary
        self.host = host
        self.port = int(port)  # 0 = pick a free port at start()
        self.log_path = Path(log_path) if log_path is not None else None
        self.proc: subprocess.Popen | None = None
        self.client: ToxiproxyClient | None = None
        self._finalizer: weakref.finalize | None = None

    def start(self, timeout_s: float = 10.0) -> ToxiproxyClient:
        if self.proc is not None and self.proc.poll() is None:
            raise ToxiproxyError(f"toxiproxy-server already running (pid {self.proc.pid})")
        if self.binary is None:
            try:
                self.binary = find_toxiproxy_binary()
            except FileNotFoundError as e:
                raise ToxiproxyError(str(e)) from e
        # A port we picked can be taken by someone else before the server binds it: retry then.
        attempts = 3 if self.port == 0 else 1
        last: ToxiproxyError | None = None
        for _ in range(attempts):
            port = self.port or free_port(self.host)
            try:
                return self._start_once(port, timeout_s)
            except _ExitedEarly as e:
                last = e  # most likely the port was taken meanwhile: try another one
            except ToxiproxyError:
                raise  # missing binary, or running but not answering: retrying will not help
        assert last is not None
        raise last

    def _start_once(self, port: int, timeout_s: float) -> ToxiproxyClient:
        assert self.binary is not None
        cmd = [self.binary, "-host", self.host, "-port", str(port), "-proxy-metrics"]
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            out: Any = open(self.log_path, "ab")
        else:
            out = subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        except OSError as e:
            self.proc = None
            raise ToxiproxyError(f"cannot run toxiproxy binary {self.binary!r}: {e}; {INSTALL_HINT}") from e
        finally:
            if out is not subprocess.DEVNULL:
                out.close()  # the child has its own descriptor
        self._finalizer = weakref.finalize(self, _terminate, self.proc)
        client = ToxiproxyClient(self.host, port, timeout_s=min(5.0, max(0.5, timeout_s)))
        end = time.monotonic() + timeout_s
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise _ExitedEarly(
                    f"toxiproxy binary {self.binary!r} exited with code {rc} right after start "
                    f"({' '.join(cmd)}){self._log_hint()}"
                )
            try:
                client.wait_ready(min(0.25, max(0.01, end - time.monotonic())))
                break
            except ToxiproxyError as e:
                if time.monotonic() >= end:
                    self.stop()
                    raise ToxiproxyError(
                        f"toxiproxy binary {self.binary!r} did not answer on {client.base_url} "
                        f"within {timeout_s:g} s: {e}{self._log_hint()}"
                    ) from e
        self.port = port
        self.client = ToxiproxyClient(self.host, port)
        return self.client

    def _log_hint(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        tail = self.log_path.read_bytes()[-1000:].decode(errors="replace").strip()
        return f"; log {self.log_path} ends with:\n{tail}"

    @property
    def api_address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        """SIGTERM, wait up to 5 s, then SIGKILL."""
        if self.proc is not None:
            _terminate(self.proc)
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None

    def __enter__(self) -> ToxiproxyServer:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
