"""The fork server (cluster/forkserver.py) as a process: it forks children on request, reports their exit
statuses as `subprocess.Popen` would, refuses a malformed request with a clear reply, and takes its
running children with it when its launcher closes it. Real processes; the preload is small (json) so
the test does not pay torch's import."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.forkserver import ForkServer, ForkServerError
from tests.conftest import pid_alive

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(tmp_path: Path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    fs = ForkServer(env, tmp_path / "forkserver.out", preload=("json",))
    fs.start()
    ready = fs.wait_ready(60)
    assert ready["pid"] == fs.proc.pid and ready["threads"] == 1  # forking a multi-threaded process is unsafe
    yield fs
    fs.close()


def test_a_child_runs_the_module_with_its_argv_and_its_exit_status_is_reported(server, tmp_path):
    out = tmp_path / "child.out"
    p = server.spawn("tests.forkserver_child", ["exit3", "--run-dir", "x"], out)
    assert p.wait(30) == 3 and p.poll() == 3 and p.returncode == 3
    text = out.read_text()
    assert f"child {p.pid} argv=['exit3', '--run-dir', 'x'] stdin=''" in text  # stdin is /dev/null
    # The server froze what its imports built: a child's full collections skip it (a 300-540 ms pass
    # over torch's objects held the GIL and delayed heartbeats past a 300 ms timeout, issue 55).
    assert int(text.split("frozen=")[1].split()[0]) > 1000, text
    q = server.spawn("tests.forkserver_child", ["exit0"], out)
    assert q.wait(30) == 0 and q.pid != p.pid
    assert out.read_text().count("child ") == 2  # appended, as a restarted process's output is


def test_an_exception_in_the_child_is_exit_1_with_its_traceback_in_its_output(server, tmp_path):
    out = tmp_path / "child.out"
    p = server.spawn("tests.forkserver_child", ["raise"], out)
    assert p.wait(30) == 1
    assert "RuntimeError: the child failed on purpose" in out.read_text()


def test_a_signalled_child_reports_minus_the_signal_and_is_not_signalled_after_its_exit(server, tmp_path):
    p = server.spawn("tests.forkserver_child", ["sleep"], tmp_path / "c.out")
    assert p.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(0.2)
    p.kill()
    assert p.wait(30) == -signal.SIGKILL
    p.terminate()  # after its exit: a no-op, never a signal to a reused pid
    assert p.returncode == -signal.SIGKILL


def test_a_malformed_request_gets_a_clear_error_and_the_server_goes_on(server, tmp_path):
    assert server.proc is not None and server.proc.stdin is not None
    server.proc.stdin.write(b'{"module": 5}\n')
    server.proc.stdin.flush()
    with pytest.raises(ForkServerError, match="could not start tests.forkserver_child: bad request"):
        server.spawn("tests.forkserver_child", ["exit0"], tmp_path / "c.out")  # reads the error reply first
    p = server.spawn("tests.forkserver_child", ["exit0"], tmp_path / "c.out")
    assert p.wait(30) == 0


def test_closing_the_server_stops_its_running_children(server, tmp_path):
    kids = [server.spawn("tests.forkserver_child", ["sleep"], tmp_path / f"c{i}.out") for i in range(2)]
    assert all(pid_alive(k.pid) for k in kids)
    assert server.close() == 0
    assert [k.poll() for k in kids] == [-signal.SIGTERM, -signal.SIGTERM]
    assert not [k.pid for k in kids if pid_alive(k.pid)]


def test_a_server_whose_launcher_dies_takes_its_children_with_it(tmp_path):
    """The server asks for SIGTERM when its parent dies, its children when the server dies."""
    script = tmp_path / "launcher.py"
    script.write_text(
        "import os, sys, time\n"
        "from cluster.forkserver import ForkServer\n"
        f"fs = ForkServer(dict(os.environ), {str(tmp_path / 'fs.out')!r}, preload=('json',))\n"
        "fs.start(); fs.wait_ready(60)\n"
        f"kid = fs.spawn('tests.forkserver_child', ['sleep'], {str(tmp_path / 'kid.out')!r})\n"
        "print(fs.proc.pid, kid.pid, flush=True)\n"
        "time.sleep(600)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    launcher = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env, text=True)
    try:
        server_pid, kid_pid = map(int, launcher.stdout.readline().split())
        assert pid_alive(server_pid) and pid_alive(kid_pid)
        launcher.kill()
        launcher.wait(10)
        deadline = time.monotonic() + 15
        while (pid_alive(server_pid) or pid_alive(kid_pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(server_pid) and not pid_alive(kid_pid)
    finally:
        if launcher.poll() is None:
            launcher.kill()
