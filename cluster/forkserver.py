"""A fork server: one process that has imported torch and the site code forks site processes on demand.

Why: a site process started with `python -m site_agent.agent` pays Python's start, the torch import
(3-7 s on 2 cores) and `torch._dynamo` (about 3 s, imported by the optimizer's constructor) before it
does anything; three sites pay it together at a run's start and a restarted site pays it again before
it can rejoin. The launcher (cluster/launcher.py, `cluster.fork_server`) starts this server once per run,
in parallel with Toxiproxy and the store; every site, first start and chaos restart alike, is then a
`fork()` of a process that has paid it.

Protocol, JSON lines: the launcher writes `{"module": M, "argv": [...], "out": PATH}` on the server's
stdin; the server answers `{"pid": N}` (or `{"error": ...}`) on its stdout, and later, when that child
exits, `{"exited": N, "returncode": RC}` (RC as `subprocess.Popen.returncode`: -SIG for a signal). The
first line is `{"ready": ...}` once the preloads are imported. An empty stdin (the launcher closed it
or died) ends the server; it then sends SIGTERM to the children still running and waits for them.

The children are the server's, and each asks for SIGTERM when the server dies; the server asks for
SIGTERM when the launcher dies: nothing outlives the run. What a child inherits is what a fresh
process would have, as far as it matters here: the run's environment (the server was started with
the site environment), default signal dispositions, stdin on /dev/null, stdout and stderr on its own
log, numpy's global generator reseeded from the OS (Python's `random` reseeds itself on fork; torch's
default generator is still at its fixed default seed, as in a fresh process, because the server draws
nothing from it). The server never touches CUDA (a CUDA context does not survive a fork).

`ForkServer` is the launcher's side; `ForkedProcess` gives a child the part of `subprocess.Popen`'s
interface the launcher and the chaos driver use (pid, poll, wait, send_signal, terminate, kill,
returncode).
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import IO, Any

_PR_SET_PDEATHSIG = 1
READY_TIMEOUT_S = 180.0  # the server's imports: torch and dynamo on a loaded 2-core machine
REPLY_TIMEOUT_S = 30.0  # a fork and its reply
# What the server imports before it says it is ready: the site agent (torch, numpy, zmq, the model
# code) and torch._dynamo, which torch.optim's constructor would otherwise import in every child.
DEFAULT_PRELOAD = ("site_agent.agent", "torch._dynamo")


_FORK_MASK = {signal.SIGTERM, signal.SIGCHLD}


class ForkServerError(RuntimeError):
    """The fork server could not start, or could not start a child."""


def _ask_parent_death_signal() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


# ---------------------------------------------------------------------------------------- server side

def _child(request: dict[str, Any], server_pid: int) -> None:
    """In the forked child: become `python -m MODULE ARGV` with output to request['out']. Never returns."""
    rc = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a fresh Python's: KeyboardInterrupt
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORK_MASK)
        _ask_parent_death_signal()
        if os.getppid() != server_pid:  # the server died between fork and prctl
            os._exit(1)
        out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        sys.stdin = open(os.devnull)
        import numpy as np

        np.random.seed()  # a fresh process seeds numpy's global generator from the OS
        module = importlib.import_module(request["module"])
        sys.argv = [request["module"], *request["argv"]]
        rc = module.main(list(request["argv"]))
        rc = 0 if rc is None else int(rc)
    except SystemExit as e:  # argparse and friends
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        rc = 1
    finally:
        try:
            atexit._run_exitfuncs()  # what a fresh interpreter runs at its exit (logging's flush, ...)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc)  # never back into the server's loop


def serve(preload: tuple[str, ...]) -> int:
    """The server's loop (`python -m cluster.forkserver`): preload, say ready, fork on request, report exits."""
    _ask_parent_death_signal()
    started = time.monotonic()
    for name in preload:
        importlib.import_module(name)
    # What the imports built (torch, dynamo: ~340,000 objects) is never garbage: frozen, the collector's
    # full passes in every child skip it, and a child's pass does not write to pages it shares with us.
    gc.collect()
    gc.freeze()
    threads = threading.active_count()
    out = sys.stdout

    def say(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    # SIGCHLD wakes the select below through a pipe, so a child's exit is reported at once.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    stopping = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.update(flag=True))
    # A Ctrl-C in the terminal reaches the whole process group: the launcher stops the run and then
    # closes this server; the server itself must not die of it first (the sites handle their own).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    children: set[int] = set()
    say({"ready": True, "pid": os.getpid(), "preload_s": round(time.monotonic() - started, 3), "threads": threads})
    stdin = sys.stdin.buffer
    pending = b""
    server_pid = os.getpid()

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                return
            if pid == 0:
                return
            children.discard(pid)
            say({"exited": pid, "returncode": os.waitstatus_to_exitcode(status)})

    while not stopping["flag"]:
        try:
            ready, _, _ = select.select([stdin, wake_r], [], [], 1.0)
        except InterruptedError:
            ready = []
        if wake_r in ready:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
        reap()
        if stdin not in ready:
            continue
        chunk = os.read(stdin.fileno(), 65536)
        if not chunk:
            break  # the launcher closed our stdin (or died)
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            try:
                request = json.loads(line)
                if not isinstance(request, dict) or not isinstance(request.get("module"), str) \
                        or not isinstance(request.get("argv"), list) or not isinstance(request.get("out"), str):
                    raise ValueError("a request is {\"module\": str, \"argv\": [str], \"out\": path}")
            except ValueError as e:
                say({"error": f"bad request {line[:200]!r}: {e}"})
                continue
            # SIGTERM and SIGCHLD stay blocked across the fork until the child has reset its handlers:
            # a SIGTERM that arrives while it starts is then delivered to the default disposition
            # (it ends the child), not to the server's handler copied into it.
            signal.pthread_sigmask(signal.SIG_BLOCK, _FORK_MASK)
            pid = os.fork()
            if pid == 0:
                os.close(wake_r)
                os.close(wake_w)
                _child(request, server_pid)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORK_MASK)
            children.add(pid)
            say({"pid": pid})
    def signal_and_reap(sig: int, wait_s: float) -> None:
        """Send `sig` to every child still running, then report their exits for at most `wait_s`."""
        for pid in list(children):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while children and time.monotonic() < deadline:
            reap()
            time.sleep(0.02)

    signal_and_reap(signal.SIGTERM, 10.0)
    signal_and_reap(signal.SIGKILL, 5.0)
    return 0


# -------------------------------------------------------------------------------------- launcher side

class ForkedProcess:
    """A child of the fork server, with the part of `subprocess.Popen` the launcher and chaos use."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server = server
        self.pid = pid
        self.returncode: int | None = None
        self.args = ["fork-server", str(pid)]

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.returncode_of(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        rc = self._server.wait_for(self.pid, timeout)
        if rc is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        self.returncode = rc
        return rc

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never signal a pid that may have been reused
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The launcher's handle on its fork server: `start()`, `spawn(module, argv, out)`, `close()`."""

    def __init__(self, env: dict[str, str], log_path: str | Path,
                 preload: tuple[str, ...] = DEFAULT_PRELOAD, preexec_fn: Any = None) -> None:
        self.env = env
        self.log_path = Path(log_path)
        self.preload = preload
        self.preexec_fn = preexec_fn
        self.proc: subprocess.Popen | None = None
        self.ready: dict[str, Any] | None = None
        self._cond = threading.Condition()
        self._replies: list[dict[str, Any]] = []
        self._exits: dict[int, int] = {}
        self._reader: threading.Thread | None = None
        self._spawn_lock = threading.Lock()
        self._eof = False

    def start(self) -> None:
        """Start the server process; `wait_ready()` blocks until its preloads are imported."""
        with open(self.log_path, "ab") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "cluster.forkserver", *self.preload],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                         env=self.env, preexec_fn=self.preexec_fn)
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), name="forkserver-reader",
                                        daemon=True)
        self._reader.start()

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            with self._cond:
                if "exited" in msg:
                    self._exits[int(msg["exited"])] = int(msg["returncode"])
                elif "ready" in msg:
                    self.ready = msg
                else:
                    self._replies.append(msg)
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> dict[str, Any]:
        with self._cond:
            self._cond.wait_for(lambda: self.ready is not None or self._eof, timeout_s)
            if self.ready is None:
                rc = self.proc.poll() if self.proc else None
                raise ForkServerError(f"the fork server was not ready within {timeout_s:.0f} s "
                                      f"(exit status {rc}; see {self.log_path})")
            return self.ready

    def spawn(self, module: str, argv: list[str], out: str | Path) -> ForkedProcess:
        """Fork a child that runs `python -m module *argv` with stdout and stderr appended to `out`."""
        self.wait_ready()
        assert self.proc is not None and self.proc.stdin is not None
        with self._spawn_lock:
            line = json.dumps({"module": module, "argv": [str(a) for a in argv], "out": str(out)}) + "\n"
            try:
                self.proc.stdin.write(line.encode())
                self.proc.stdin.flush()
            except OSError as e:
                raise ForkServerError(f"the fork server is gone ({e}; see {self.log_path})") from e
            with self._cond:
                self._cond.wait_for(lambda: self._replies or self._eof, REPLY_TIMEOUT_S)
                if not self._replies:
                    raise ForkServerError(f"the fork server did not answer a request for {module} "
                                          f"within {REPLY_TIMEOUT_S:.0f} s (see {self.log_path})")
                reply = self._replies.pop(0)
        if "pid" not in reply:
            raise ForkServerError(f"the fork server could not start {module}: {reply.get('error', reply)}")
        return ForkedProcess(self, int(reply["pid"]))

    def returncode_of(self, pid: int) -> int | None:
        with self._cond:
            if pid in self._exits:
                return self._exits[pid]
            if self._eof:
                return -signal.SIGKILL  # the server died and took its children with it (their death signal)
            return None

    def wait_for(self, pid: int, timeout: float | None) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits or self._eof, timeout)
        return self.returncode_of(pid)

    def close(self, timeout_s: float = 15.0) -> int | None:
        """End the server: close its stdin (it stops its remaining children), wait for it to exit."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()
        finally:
            if self._reader is not None:
                self._reader.join(2.0)


def main(argv: list[str] | None = None) -> int:
    preload = tuple(sys.argv[1:] if argv is None else argv) or DEFAULT_PRELOAD
    return serve(preload)


if __name__ == "__main__":
    sys.exit(main())
