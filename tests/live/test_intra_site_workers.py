"""Intra-site data parallelism: W = 2 worker processes per site joined by a real gloo group.

Real site processes, real worker processes, real gloo over loopback, real Toxiproxy between
sites; these fail (never skip) when any of them cannot start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from site_agent.collective import reduce_in_order
from site_agent.data import batch_for, load_corpus, sample_order
from ground.schedule import ids_at, rounds_for_target, samples_per_round, site_positions, target_samples
from site_agent.trainer import SiteTrainer
from site_agent.worker import rank_slice
from tests.conftest import ROOT, assert_ledger_balanced, events, run_cluster
from ground.config import config_from_json, load_config, save_config

W = 2
SITES = ("a", "b", "c")


def _alive(pid: int) -> bool:
    """True if pid is a live (non-zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_the_site_agent_refuses_a_batch_its_workers_cannot_split(tmp_path):
    cfg = load_config({"run_id": "bad", "train": {"per_site_batch": 8, "workers_per_site": 3}})
    save_config(cfg, tmp_path / "config.json")
    r = subprocess.run([sys.executable, "-m", "site_agent.agent", "--run-dir", str(tmp_path), "--site", "a"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "workers_per_site=3 must divide train.per_site_batch=8" in r.stderr, r.stderr
    assert not (tmp_path / "logs").exists()  # refused before spawning anything


def test_two_workers_per_site_keep_identical_state_and_train(tmp_path):
    run_dir, s = run_cluster(tmp_path, {"train": {"mode": "local", "workers_per_site": W, "per_site_batch": 8,
                                                  "inner_steps_h": 4, "target_useful_tokens": 24_576}})
    assert s["clean_exit"], s["exit_codes"]
    assert all(rc == 0 for rc in s["exit_codes"].values()), s["exit_codes"]
    # The work ledger balances and the target is reached: counted once per site, by rank 0.
    assert_ledger_balanced(run_dir, s)  # rank 0's logs against the commit record
    assert s["lost_tokens"] == 0 and s["retained_tokens"] == s["useful_tokens"]
    assert s["useful_tokens"] >= s["target_useful_tokens"] == 24_576
    # Held-out NLL falls from the initial weights.
    curve = [p["heldout_nll"] for p in s["heldout_nll_curve"]]
    assert s["heldout_nll_curve"][0]["round"] == -1 and len(curve) >= 3, s["heldout_nll_curve"]
    assert curve[-1] < curve[0] - 0.5, curve

    rounds = len([e for e in events(run_dir, "a") if e["event"] == "round_done"])
    assert rounds == 2  # 192 samples / (3 sites x 8 x 4 steps) per round
    for site in SITES:
        ev = events(run_dir, site)
        started = next(e for e in ev if e["event"] == "site_started")
        assert started["workers_per_site"] == W and started["threads"] == 1
        # Rank 0 logs the site's whole batch of every inner step: per_site_batch samples, H per round.
        work = [e for e in ev if e["event"] == "work_attempted"]
        assert [len(e["samples"]) for e in work] == [8] * (4 * rounds)
        assert [(e["round"], e["inner_step"]) for e in work] == [(r, h) for r in range(rounds) for h in range(4)]
        # Every round (and the start) the ranks agreed on their parameters.
        checks = [e for e in ev if e["event"] == "intra_site_check"]
        assert [c["round"] for c in checks] == list(range(-1, rounds)), checks
        assert all(c["passed"] and c["world"] == W and c["mismatched_ranks"] == [] for c in checks), checks
        done = {e["round"]: e["param_hash"] for e in ev if e["event"] == "round_done"}
        assert all(c["params_hash"] == done[c["round"]] for c in checks if c["round"] >= 0)
        assert checks[0]["params_hash"] == started["params_hash"]
        stopped = [e for e in ev if e["event"] == "workers_stopped"]
        assert len(stopped) == 1 and stopped[0]["sent_stop"] and stopped[0]["exit_codes"] == {"1": 0}, stopped
        assert [e for e in ev if e["event"] == "site_stopped"][-1]["reason"] == "completed"

        # The worker (rank 1): its own log, the same rounds and hashes, no site-level accounting.
        wname = f"{site}.w1"
        wev = events(run_dir, wname)
        assert (run_dir / "logs" / f"{wname}.jsonl").exists()
        kinds = [e["event"] for e in wev]
        assert kinds[0] == "worker_started" and kinds[-1] == "worker_stopped", kinds
        assert not {"work_attempted", "wan_counters", "collective", "eval", "site_started"} & set(kinds), kinds
        assert all(e["process"] == wname and e["run_id"] == s["run_id"] for e in wev)
        assert [e["id"] for e in wev] == [f"{wname}:{i}" for i in range(len(wev))]
        wstart = wev[0]
        assert wstart["rank"] == 1 and wstart["world"] == W and wstart["threads"] == 1
        assert wstart["parent_pid"] == started["pid"]
        wrounds = [e for e in wev if e["event"] == "worker_round"]
        assert [e["round"] for e in wrounds] == list(range(rounds))
        assert all(e["agrees_with_rank0"] and e["param_hash"] == done[e["round"]] for e in wrounds)
        assert all(e["samples"] == 4 * 4 for e in wrounds)  # half of 8 samples, 4 inner steps
        computes = [e for e in wev if e["event"] == "worker_compute"]
        assert len(computes) == rounds and all("error" not in e for e in computes)
        assert wev[-1]["reason"] == "stop from rank 0" and wev[-1]["rc"] == 0
        # No orphans: the site and its worker are gone.
        assert not _alive(wstart["pid"]) and not _alive(started["pid"])
    assert (run_dir / "summary.json").exists()


@pytest.mark.parametrize("how", ["ctrl_c", "sigterm"])
def test_stopping_the_run_mid_round_leaves_no_worker_behind(tmp_path, how):
    """ctrl_c: SIGINT to every process of the run's process group (what Ctrl-C in a terminal does;
    the workers ignore it, rank 0 decides). sigterm: SIGTERM to the launcher only, which SIGTERMs
    its children. Either way rank 0 stops its worker (STOP at a round boundary, or PDEATHSIG
    when rank 0 itself is killed) and no process of the run is left."""
    cmd = [sys.executable, "-m", "xdc.cli", "run", "--quiet", "--runs-dir", str(tmp_path),
           "--set", "train.workers_per_site=2", "--set", "train.threads_per_site=1", "--set", "train.device=cpu",
           "--set", "train.inner_steps_h=2", "--set", "train.target_useful_tokens=10000000"]
    out = open(tmp_path / "launcher.out", "wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        deadline = time.monotonic() + 120
        wlog = None
        while time.monotonic() < deadline and proc.poll() is None:
            latest = tmp_path / "latest"
            if latest.exists():
                run_dir = latest.resolve()
                wlog = run_dir / "logs" / "a.w1.jsonl"
                try:
                    if any(e["event"] == "worker_round" for e in events(run_dir, "a.w1")):
                        break
                except (FileNotFoundError, json.JSONDecodeError):
                    pass
            time.sleep(0.2)
        else:
            raise AssertionError(f"no worker finished a round (launcher rc {proc.poll()})")
        if how == "ctrl_c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.close()
    assert wlog is not None
    run_dir = wlog.parent.parent
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["interrupted"]
    for site in SITES:
        ev = events(run_dir, site)
        site_pid = next(e for e in ev if e["event"] == "site_started")["pid"]
        assert all(e["passed"] for e in ev if e["event"] == "intra_site_check")
        wev = events(run_dir, f"{site}.w1")
        if s["exit_codes"][site] == 0:
            # Rank 0 saw the signal at a round boundary: it sent STOP and its worker exited cleanly.
            assert [e for e in ev if e["event"] == "site_stopped"][-1]["reason"] == "signal"
            stopped = [e for e in ev if e["event"] == "workers_stopped"]
            assert len(stopped) == 1 and stopped[0]["exit_codes"] == {"1": 0}, stopped
            assert wev[-1]["event"] == "worker_stopped" and wev[-1]["rc"] == 0, wev[-1]
        # Otherwise the launcher had to SIGKILL rank 0 (Ctrl-C also stops toxiproxy-server, so a
        # WAN collective in flight cannot finish) and PR_SET_PDEATHSIG took its worker with it.
        assert _gone_soon([wev[0]["pid"], site_pid]), (site, wev[0]["pid"], site_pid)
    # Nothing of the run is left in its process group. (A worker whose rank 0 was SIGKILLed gets
    # its SIGTERM from the kernel as the launcher returns; give it a moment to finish dying.)
    assert _gone_soon(None, pgid=proc.pid)


def _gone_soon(pids: list[int] | None, pgid: int | None = None, within_s: float = 10.0) -> bool:
    """Whether the given pids (or every process of process group pgid) stop being alive within_s."""
    deadline = time.monotonic() + within_s
    while True:
        if pids is None:
            left = [int(p) for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == pgid]
        else:
            left = list(pids)
        left = [p for p in left if _alive(p)]
        if not left:
            return True
        if time.monotonic() > deadline:
            print("still alive:", left)
            return False
        time.sleep(0.1)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_sync_mode_with_two_workers_matches_a_single_process_bitwise(tmp_path):
    """Sync mode, W = 2: each site's grad is the mean of its two ranks' half-batch grads (one gloo
    SUM of two float32 vectors, then / 2), then the WAN mean over sites. One process that does the
    same arithmetic in the same order ends with the same weights, bit for bit."""
    run_dir, s = run_cluster(tmp_path, {"train": {"mode": "sync", "workers_per_site": W,
                                                  "target_useful_tokens": 12_288}})
    assert s["clean_exit"], s["exit_codes"]
    cfg = config_from_json(run_dir / "config.json")
    sites = sorted(cfg.cluster.sites)
    n = len(sites)
    torch.set_num_threads(1)  # each rank ran with one thread
    corpus = load_corpus(cfg.data)
    order = sample_order(corpus, cfg.model.seq_len, cfg.data.shuffle_seed)
    ref = SiteTrainer(cfg, torch.device("cpu"))
    steps = rounds_for_target(cfg, n)
    assert steps == 4
    for step in range(steps):
        site_grads = []
        for i in range(n):
            ids = ids_at(order, site_positions(cfg, n, step * samples_per_round(cfg, n), 0, i, target_samples(cfg)))
            parts = [torch.from_numpy(ref.compute_grads(*batch_for(corpus, rank_slice(ids, k, W),
                                                                    cfg.model.seq_len))[1].copy())
                     for k in range(W)]
            site_grads.append(((parts[0] + parts[1]) / W).numpy())
        ref.apply_grads(reduce_in_order(site_grads), frontier_tokens=step * n * cfg.train.per_site_batch * cfg.model.seq_len)
    for site in sites:
        ev = events(run_dir, site)
        done = [e for e in ev if e["event"] == "round_done"]
        assert len(done) == steps and done[-1]["param_hash"] == ref.params_hash(), site
        assert all(c["passed"] for c in ev if c["event"] == "intra_site_check")
        wrounds = [e for e in events(run_dir, f"{site}.w1") if e["event"] == "worker_round"]
        assert [e["param_hash"] for e in wrounds] == [e["param_hash"] for e in done]
    start = [e for e in events(run_dir, sites[0]) if e["event"] == "site_started"][0]["params_hash"]
    assert start != ref.params_hash()
