"""A small typed client for the real Toxiproxy server, and a helper that runs the server.

Every WAN link of the emulator is one Toxiproxy proxy; its latency, jitter and bandwidth are
toxics, and faults (blackholes, resets, partitions) are toxics or a disabled proxy. This module
is the only place that talks to Toxiproxy's JSON control API.

Why not the `toxiproxy-python` package: its last release is from 2019, its HTTP calls have no
timeouts (the control API has been seen to hang while toxics are removed under load, which would
hang the whole run), and it cannot update a toxic's attributes in place. This client uses only
the standard library (urllib), puts a timeout on every call, never goes through an HTTP proxy
from the environment, and raises `ToxiproxyError` with the method, path, HTTP status and the
server's error text.

Toxiproxy facts this module relies on (v2.12.0):
  * a proxy created with listen "127.0.0.1:0" picks a free port; the reply's "listen" is real,
    and disabling then re-enabling the proxy listens on that same port again;
  * toxic names are unique per proxy (not per stream), hence the `_up`/`_down` suffixes;
  * the `stream` "upstream" is client->server, "downstream" is server->client;
  * bandwidth `rate` is in KB/s with KB = 1000 bytes; rate 0 hangs the connection, so it is
    refused here;
  * POST on an existing toxic/proxy still works but is deprecated in favour of PATCH, which
    merges the given attributes into the existing ones;
  * unknown toxic attributes are silently ignored by the server;
  * `POST /reset` removes all toxics and re-enables all proxies, it does not delete proxies;
  * removing a `timeout` toxic closes the connections it was holding (its cleanup closes them);
  * the byte counters of /metrics only move when a connection (direction) ends, see
    `ToxiproxyClient.proxy_bytes`;
  * a `go install` build reports version "git".
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ground.config import LinkProfile, LinkSpec

Stream = Literal["upstream", "downstream"]

INSTALL_HINT = (
    "run `make setup`, or `go install github.com/Shopify/toxiproxy/v2/cmd/server@v2.12.0` "
    "and put the binary on PATH as toxiproxy-server"
)


class ToxiproxyError(RuntimeError):
    """A Toxiproxy call failed, or the server could not be started.

    For HTTP failures `method`, `path`, `status` (None when no HTTP answer came back, e.g.
    connection refused or timed out) and `server_error` (the server's "error" text) are set.
    """

    def __init__(
        self,
        message: str,
        *,
        method: str | None = None,
        path: str | None = None,
        status: int | None = None,
        server_error: str | None = None,
    ) -> None:
        super().__init__(message)
        self.method = method
        self.path = path
        self.status = status
        self.server_error = server_error


@dataclass(frozen=True)
class Proxy:
    name: str
    listen: str  # the real "host:port" the proxy listens on
    upstream: str  # "host:port" it forwards to
    enabled: bool

    @property
    def listen_port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Proxy:
        return cls(name=d["name"], listen=d["listen"], upstream=d["upstream"], enabled=bool(d["enabled"]))


# No HTTP proxy from the environment (http_proxy etc.) may sit between us and a loopback server.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ToxiproxyClient:
    """Typed client for one Toxiproxy server's control API. Every call times out after `timeout_s`
    (per connect / per socket read) and raises `ToxiproxyError` on any failure."""

    def __init__(self, host: str = "127.0.0.1", port: int = 8474, timeout_s: float = 5.0) -> None:
        self.host = host
        self.port = int(port)
        self.timeout_s = float(timeout_s)

    def __repr__(self) -> str:
        return f"ToxiproxyClient({self.base_url!r}, timeout_s={self.timeout_s})"

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # ---- transport -------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None, *, timeout_s: float | None = None) -> bytes:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        where = f"{method} {self.base_url}{path}"
        try:
            with _OPENER.open(req, timeout=timeout) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            try:
                raw = e.read().decode(errors="replace")
            except Exception:  # the error body itself could not be read
                raw = ""
            finally:
                e.close()
            try:
                server_error = str(json.loads(raw).get("error", raw))
            except (ValueError, AttributeError):
                server_error = raw.strip()
            raise ToxiproxyError(
                f"toxiproxy: {where} -> HTTP {e.code}: {server_error or e.reason}",
                method=method,
                path=path,
                status=e.code,
                server_error=server_error,
            ) from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            if isinstance(reason, (TimeoutError, socket.timeout)):
                msg = f"timed out after {timeout:g} s"
            else:
                msg = f"{type(reason).__name__}: {reason}"
            raise ToxiproxyError(
                f"toxiproxy: {where} -> no answer ({msg}); is toxiproxy-server running there?",
                method=method,
                path=path,
            ) from e

    def _json(self, method: str, path: str, body: Any = None) -> Any:
        raw = self._call(method, path, body)
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError as e:
            raise ToxiproxyError(
                f"toxiproxy: {method} {self.base_url}{path} -> reply is not JSON: {raw[:200]!r}",
                method=method,
                path=path,
            ) from e

    @staticmethod
    def _p(name: str) -> str:
        return urllib.parse.quote(name, safe="")

    # ---- server ----------------------------------------------------------------------------

    def version(self) -> str:
        """The server's version string (a `go install` build reports "git")."""
        raw = self._call("GET", "/version").decode(errors="replace").strip()
        try:
            v = json.loads(raw)
        except ValueError:
            return raw
        return str(v.get("version", raw)) if isinstance(v, dict) else str(v)

    def wait_ready(self, deadline_s: float) -> None:
        """Poll /version for up to `deadline_s` seconds (a duration) until the server answers."""
        end = time.monotonic() + deadline_s
        last: ToxiproxyError | None = None
        while True:
            left = end - time.monotonic()
            if left <= 0:
                break
            try:
                self._call("GET", "/version", timeout_s=max(0.05, min(self.timeout_s, left)))
                return
            except ToxiproxyError as e:
                last = e
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        raise ToxiproxyError(
            f"toxiproxy at {self.base_url} not ready after {deadline_s:g} s (last error: {last})",
            method="GET",
            path="/version",
        )

    def reset(self) -> None:
        """Remove every toxic and re-enable every proxy (proxies are kept)."""
        self._call("POST", "/reset")

    def metrics_text(self) -> str:
        """The Prometheus text of GET /metrics (needs the server started with -proxy-metrics)."""
        return self._call("GET", "/metrics").decode(errors="replace")

    def proxy_bytes(self) -> dict[str, dict[str, int]]:
        """Bytes that entered each proxy: {proxy: {"upstream": n, "downstream": n}}.

        "upstream" counts client->server bytes, "downstream" server->client bytes; series of the
        same proxy with different listeners (a re-created proxy) are summed. Proxies that have
        not finished a connection yet are absent.

        CAVEAT: Toxiproxy adds a connection's bytes to the counter only when that direction of
        the connection ENDS (its io.Copy returns: EOF, reset, proxy disabled). Bytes of
        connections still open are not counted at all, so this is a per-closed-connection
        total, not a live gauge of a long-lived connection.
        """
        # We count `received` rather than `sent`: received is what entered the proxy from the
        # sender, i.e. what the application put on the wire. Toxics can make the two differ
        # (limit_data drops the rest, a timeout/blackhole toxic holds bytes back, a disabled
        # proxy discards what is in flight), and the emulator's accounting is about offered load.
        out: dict[str, dict[str, int]] = {}
        for name, labels, value in _parse_metrics(self.metrics_text()):
            if name != "toxiproxy_proxy_received_bytes_total":
                continue
            proxy, direction = labels.get("proxy"), labels.get("direction")
            if proxy is None or direction not in ("upstream", "downstream"):
                continue
            d = out.setdefault(proxy, {"upstream": 0, "downstream": 0})
            d[direction] += value
        return out

    # ---- proxies ---------------------------------------------------------------------------

    def create_proxy(self, name: str, listen: str, upstream: str, enabled: bool = True) -> Proxy:
        """Create a proxy; listen "127.0.0.1:0" picks a free port (see the returned `listen`)."""
        body = {"name": name, "listen": listen, "upstream": upstream, "enabled": enabled}
        return Proxy.from_json(self._json("POST", "/proxies", body))

    def get_proxy(self, name: str) -> Proxy:
        return Proxy.from_json(self._json("GET", f"/proxies/{self._p(name)}"))

    def list_proxies(self) -> dict[str, Proxy]:
        data = self._json("GET", "/proxies") or {}
        return {k: Proxy.from_json(v) for k, v in data.items()}

    def set_enabled(self, name: str, enabled: bool) -> Proxy:
        """Disabling closes the proxy's listener and every open connection through it;
        enabling listens again on the same address."""
        return Proxy.from_json(self._json("PATCH", f"/proxies/{self._p(name)}", {"enabled": bool(enabled)}))

    def delete_proxy(self, name: str) -> None:
        self._call("DELETE", f"/proxies/{self._p(name)}")

    # ---- toxics ----------------------------------------------------------------------------

    def add_toxic(
        self,
        proxy: str,
        name: str,
        type: str,
        stream: Stream,
        attributes: dict[str, Any],
        toxicity: float = 1.0,
    ) -> dict[str, Any]:
        """Add a toxic; returns the server's view of it. Fails with HTTP 409 if the name exists."""
        if stream not in ("upstream", "downstream"):
            raise ValueError(f"toxic {name!r}: stream must be 'upstream' or 'downstream', got {stream!r}")
        _check_attributes(name, attributes)
        body = {"name": name, "type": type, "stream": stream, "toxicity": float(toxicity), "attributes": attributes}
        return self._json("POST", f"/proxies/{self._p(proxy)}/toxics", body)

    def update_toxic(self, proxy: str, name: str, attributes: dict[str, Any]) -> dict[str, Any]:
        """Change attributes of an existing toxic in place (given keys replace, others are kept)."""
        _check_attributes(name, attributes)
        return self._json("PATCH", f"/proxies/{self._p(proxy)}/toxics/{self._p(name)}", {"attributes": attributes})

    def remove_toxic(self, proxy: str, name: str) -> None:
        self._call("DELETE", f"/proxies/{self._p(proxy)}/toxics/{self._p(name)}")

    def list_toxics(self, proxy: str) -> list[dict[str, Any]]:
        return list(self._json("GET", f"/proxies/{self._p(proxy)}/toxics") or [])


def _check_attributes(toxic: str, attributes: dict[str, Any]) -> None:
    # Only the bandwidth toxic has "rate"; rate 0 stalls a connection forever instead of unshaping it.
    if "rate" in attributes and not attributes["rate"] > 0:
        raise ValueError(f"toxic {toxic!r}: bandwidth rate must be > 0 KB/s (remove the toxic to unshape)")


_METRIC_RE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _parse_metrics(text: str) -> list[tuple[str, dict[str, str], int]]:
    """(name, labels, integer value) of each sample line of a Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _METRIC_RE.match(line)
        if not m:
            continue
        labels = {
            k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
            for k, v in _LABEL_RE.findall(m.group(2) or "")
        }
        try:
            # Go prints large counters in exponent form ("1e+06"); exact below 2**53.
            value = int(float(m.group(3)))
        except (ValueError, OverflowError):
            continue
        out.append((m.group(1), labels, value))
    return out


# ---- link shaping -----------------------------------------------------------------------------

_DIRECTIONS: tuple[tuple[str, Stream], ...] = (("up", "upstream"), ("down", "downstream"))
SHAPING_TOXICS = tuple(f"shape_{kind}_{d}" for d, _ in _DIRECTIONS for kind in ("latency", "bandwidth"))


def _wanted(profile: LinkProfile) -> list[tuple[str, str, dict[str, int]]]:
    for f in ("latency_ms", "jitter_ms", "bandwidth_kbps"):
        v = getattr(profile, f)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"LinkProfile.{f} must be a non-negative integer, got {v!r}")
    out = []
    if profile.latency_ms > 0 or profile.jitter_ms > 0:
        out.append(("latency", "latency", {"latency": profile.latency_ms, "jitter": profile.jitter_ms}))
    if profile.bandwidth_kbps > 0:
        out.append(("bandwidth", "bandwidth", {"rate": profile.bandwidth_kbps}))
    return out


def apply_link_spec(client: ToxiproxyClient, proxy_name: str, spec: LinkSpec) -> list[str]:
    """Idempotently make the proxy's shaping toxics match `spec`.

    Per direction ("up" -> stream "upstream", "down" -> "downstream") it keeps
    `shape_latency_<d>` (latency + jitter, only if either is > 0) and `shape_bandwidth_<d>`
    (only if bandwidth_kbps > 0): adds missing ones, updates changed attributes in place, and
    removes shaping toxics the spec no longer asks for. Other toxics (faults) are left alone.
    Returns the names of the shaping toxics now present, in a fixed order.
    """
    existing = {t["name"]: t for t in client.list_toxics(proxy_name)}
    present: list[str] = []
    for d, stream in _DIRECTIONS:
        wanted = {f"shape_{kind}_{d}": (typ, attrs) for kind, typ, attrs in _wanted(getattr(spec, d))}
        for kind in ("latency", "bandwidth"):
            name = f"shape_{kind}_{d}"
            cur = existing.get(name)
            if name not in wanted:
                if cur is not None:
                    client.remove_toxic(proxy_name, name)
                continue
            typ, attrs = wanted[name]
            if cur is not None and (cur.get("type") != typ or cur.get("stream") != stream or cur.get("toxicity") != 1):
                client.remove_toxic(proxy_name, name)
                cur = None
            if cur is None:
                client.add_toxic(proxy_name, name, typ, stream, attrs)
            elif any(cur.get("attributes", {}).get(k) != v for k, v in attrs.items()):
                client.update_toxic(proxy_name, name, attrs)
            present.append(name)
    return present


# ---- the server process -----------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (another process may still take it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
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

