"""Intra-site data parallelism: the W worker processes of one site and their gloo group.

`python -m site_agent.worker --run-dir RUN --site a --rank k --world W --master-port P`

A site with `train.workers_per_site` W > 1 is W OS processes joined by a torch.distributed
**gloo** process group over loopback (the fast intra-site LAN). Rank 0 is the site agent
(`site_agent.agent`): the only rank on the WAN (WanNode, coordinator, store), the one that
logs the site's work. It spawns ranks 1..W-1 (this module's `main`), which die with it
(PR_SET_PDEATHSIG) and log to `RUN/logs/<site>.w<k>.jsonl` (process `<site>.w<k>`; never
`work_attempted` or `wan_counters`: the analysis counts a site's work and bytes once, from rank 0).

Every inner step the site's batch of `per_site_batch` samples is split: rank k trains on
`ids[k::W]`; after backward the ranks average their grads over the group (SiteTrainer with
`group`), so every rank steps identically. Each round rank 0 drives the workers with small
int64 control tensors broadcast from rank 0, [round, flag, n_members, site_index, epoch]:

    rank 0                                   ranks 1..W-1
    control(ROUND)  ------ broadcast ----->  compute the round on their slices
    compute (grad all-reduce every step) <-> compute (grad all-reduce every step)
    WAN collective (only rank 0)
    control(APPLY) + avg vector [P] ------>  receive the WAN-averaged vector
    apply (apply_grads / apply_outer)        apply (the same)
    all_gather of params_hash digests <->    all_gather of params_hash digests
    log intra_site_check; mismatch -> stop
    ...
    control(STOP)  ------ broadcast ----->  leave the loop, destroy the group, exit 0

Between two control messages the workers only ever wait on a broadcast from rank 0, so rank 0
can stop them at any of those points (signal, WAN collective aborted, mismatch); if the group
itself broke (a worker died) rank 0 terminates the rest instead.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from site_agent.trainer import IntraSiteError

if TYPE_CHECKING:
    from site_agent.trainer import SiteTrainer
from ground.config import ConfigError, RunConfig
from ground.eventlog import EventLog

STOP, ROUND, APPLY, STATE = 0, 1, 2, 3  # control flags
CONTROL_LEN = 7  # [round, flag, n_members, site_index, epoch, cursor_start, cursor_end (STATE: byte length)]
CONNECT_TIMEOUT_S = 180.0  # rank 0 gives its workers this long to start and join the group
STOP_GRACE_S = 5.0  # after STOP, how long rank 0 waits for a worker to exit before SIGTERM
_PR_SET_PDEATHSIG = 1


class IntraSiteMismatch(IntraSiteError):
    """The ranks of a site hold different parameters."""


# --------------------------------------------------------------------- configuration
def check_workers(cfg: RunConfig) -> int:
    """W = train.workers_per_site after checking it can split the site's batch; raises ConfigError."""
    w, b = cfg.train.workers_per_site, cfg.train.per_site_batch
    if w < 1:
        raise ConfigError(f"train.workers_per_site: must be >= 1, got {w}")
    if b % w != 0:
        raise ConfigError(f"train.workers_per_site={w} must divide train.per_site_batch={b}: each worker "
                          f"trains on per_site_batch / workers_per_site samples per step "
                          f"(use a per_site_batch that is a multiple of {w})")
    return w


def site_threads(cfg: RunConfig) -> int:
    """The site's torch thread budget: threads_per_site, or cores // sites (min 1)."""
    return cfg.train.threads_per_site or max(1, (os.cpu_count() or 1) // len(cfg.cluster.sites))


def threads_per_worker(cfg: RunConfig) -> int:
    """The site's budget divided among its W workers, min 1 each (W = 1: the whole budget)."""
    return max(1, site_threads(cfg) // cfg.train.workers_per_site)


def rank_slice(ids: list[int], rank: int, world: int) -> list[int]:
    """The samples rank `rank` of `world` trains on in one step of the site's batch `ids`."""
    return ids[rank::world]


def group_timeout(cfg: RunConfig) -> datetime.timedelta:
    """gloo op timeout: longer than anything rank 0 does between two broadcasts to its workers
    (join, a WAN collective, eval, a checkpoint write). A dead rank 0 ends its workers sooner:
    PR_SET_PDEATHSIG and the closed sockets."""
    return datetime.timedelta(seconds=max(1800.0, 2 * cfg.wan.collective_timeout_ms / 1000 + 600.0))


def _die_with_parent() -> None:
    """Child side of Popen: SIGTERM when the site's rank 0 dies, so no worker is orphaned."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def _init_group(rank: int, world: int, port: int, timeout: datetime.timedelta) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the intra-site LAN is loopback
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timeout)


# ------------------------------------------------------------------- group messages
def _broadcast(t: torch.Tensor) -> torch.Tensor:
    try:
        dist.broadcast(t, src=0)
    except Exception as e:
        raise IntraSiteError(f"intra-site broadcast failed: {type(e).__name__}: {e}") from e
    return t


def recv_control() -> list[int]:
    return _broadcast(torch.zeros(CONTROL_LEN, dtype=torch.int64)).tolist()


def gather_hashes(phash: str, world: int) -> list[str]:
    """Every rank's params_hash (sha256 hex), in rank order, via an all_gather of uint8 [32]."""
    mine = torch.frombuffer(bytearray(bytes.fromhex(phash)), dtype=torch.uint8)  # [32]
    out = [torch.zeros(32, dtype=torch.uint8) for _ in range(world)]
    try:
        dist.all_gather(out, mine)
    except Exception as e:
        raise IntraSiteError(f"intra-site hash all_gather failed: {type(e).__name__}: {e}") from e
    return [bytes(t.tolist()).hex() for t in out]


def _load_state(trainer: "SiteTrainer", nbytes: int) -> None:
    from site_agent.state import load_blobs
    from site_agent.state_transfer import unpack_state

    data = _broadcast(torch.empty(nbytes, dtype=torch.uint8)).numpy().tobytes()
    load_blobs(trainer, unpack_state(data))


# ------------------------------------------------------------------- rank 0's side
class WorkerPool:
    """Rank 0's handle on ranks 1..W-1: spawn, join the group, drive each round, stop."""

    def __init__(self, run_dir: Path, cfg: RunConfig, site: str, log: EventLog) -> None:
        self.run_dir = run_dir
        self.cfg = cfg
        self.site = site
        self.log = log
        self.world = cfg.train.workers_per_site
        self.threads = threads_per_worker(cfg)
        self.procs: dict[int, subprocess.Popen] = {}
        self.port = 0
        self.connected = False
        self.at_control = False  # the workers are (or will be) waiting for a control message
        self.closed = False
        self._init_thread: threading.Thread | None = None
        self._init_result: dict[str, BaseException | bool] = {}
        self._t0 = 0.0

    def start(self) -> None:
        """Spawn ranks 1..W-1 and start joining the group as rank 0 in the background (rank 0
        binds the rendezvous store on the port at once, so the port is held within milliseconds
        of being picked; the workers retry until it answers). connect() waits for the join."""
        from wan.toxiproxy import free_port

        self.port = free_port("127.0.0.1")
        t = str(self.threads)
        env = dict(os.environ, OMP_NUM_THREADS=t, MKL_NUM_THREADS=t, PYTHONUNBUFFERED="1")
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        for k in range(1, self.world):
            out = open(self.run_dir / "logs" / f"{self.site}.w{k}.out", "wb")
            try:
                self.procs[k] = subprocess.Popen(
                    [sys.executable, "-m", "site_agent.worker", "--run-dir", str(self.run_dir), "--site", self.site,
                     "--rank", str(k), "--world", str(self.world), "--master-port", str(self.port)],
                    stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent)
            finally:
                out.close()  # the child holds its own copy
        result = self._init_result

        def _init() -> None:
            try:
                _init_group(0, self.world, self.port, group_timeout(self.cfg))
                result["ok"] = True
            except BaseException as e:  # reported by connect()
                result["error"] = e

        self._t0 = time.monotonic()
        self._init_thread = threading.Thread(target=_init, name="intra-site-init", daemon=True)
        self._init_thread.start()
        self.log.emit("workers_spawned", world=self.world, master_port=self.port, threads_per_worker=self.threads,
                      pids={k: p.pid for k, p in self.procs.items()})

    def connect(self, should_stop: Callable[[], bool]) -> bool:
        """Wait until the group (joined in the background since start()) has formed, while watching
        the workers. False: a signal asked to stop first. Raises IntraSiteError if a worker exits
        or the group does not form in time."""
        th, result, t0 = self._init_thread, self._init_result, self._t0
        assert th is not None, "start() first"
        while th.is_alive():
            th.join(0.2)
            if not th.is_alive():
                break
            dead = {k: p.poll() for k, p in self.procs.items() if p.poll() is not None}
            if dead:
                raise IntraSiteError(f"worker(s) exited before joining the intra-site group: exit codes {dead} "
                                     f"(see logs/{self.site}.w<k>.out)")
            if should_stop():
                return False
            if time.monotonic() - t0 > CONNECT_TIMEOUT_S:
                raise IntraSiteError(f"intra-site group did not form within {CONNECT_TIMEOUT_S:.0f} s")
        if "error" in result:
            e = result["error"]
            raise IntraSiteError(f"joining the intra-site group failed: {type(e).__name__}: {e}")
        self.connected = True
        self.log.emit("intra_site_group", world=self.world, backend=dist.get_backend(),
                      connect_s=round(time.monotonic() - t0, 3))
        return True

    def _control(self, rnd: int, flag: int, n: int = 0, idx: int = 0, epoch: int = 0, cs: int = 0, ce: int = 0) -> None:
        _broadcast(torch.tensor([rnd, flag, n, idx, epoch, cs, ce], dtype=torch.int64))

    def begin_round(self, rnd: int, n_members: int, site_index: int, epoch: int, cursor_start: int,
                    cursor_end: int) -> None:
        """Send the workers into round `rnd`; they compute with rank 0 until compute_done()."""
        assert self.at_control
        self._control(rnd, ROUND, n_members, site_index, epoch, cursor_start, cursor_end)
        self.at_control = False

    def load_state(self, data: bytes) -> None:
        """Every rank takes rank 0's whole state (a rollback, a donor's state, a checkpoint)."""
        assert self.at_control
        self._control(-1, STATE, 0, 0, 0, len(data), 0)
        _broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8))

    def compute_done(self) -> None:
        self.at_control = True  # the workers finished the round's compute and wait for APPLY

    def share(self, rnd: int, avg: np.ndarray) -> None:
        """Broadcast the WAN-averaged vector [P] float32 for every rank to apply."""
        assert self.at_control
        self._control(rnd, APPLY)
        self.at_control = False
        _broadcast(torch.from_numpy(np.ascontiguousarray(avg, dtype=np.float32)))

    def check(self, rnd: int, phash: str) -> None:
        """Every rank's params_hash must equal rank 0's; logs intra_site_check, raises on mismatch."""
        hashes = gather_hashes(phash, self.world)
        self.at_control = True
        ok = all(h == phash for h in hashes)
        self.log.emit("intra_site_check", round=rnd, passed=ok, world=self.world, params_hash=phash,
                      mismatched_ranks=[k for k, h in enumerate(hashes) if h != phash])
        if not ok:
            raise IntraSiteMismatch(f"round {rnd}: params_hash of ranks {hashes} differ from rank 0's {phash}")

    def close(self, reason: str) -> None:
        """Stop the workers (STOP when they wait for it, else SIGTERM), wait, destroy the group."""
        if self.closed:
            return
        self.closed = True
        sent_stop = False
        if self.connected and self.at_control:
            try:
                self._control(-1, STOP)
                sent_stop = True
            except IntraSiteError:
                pass
        deadline = time.monotonic() + (STOP_GRACE_S if sent_stop else 0.0)
        codes: dict[int, int | None] = {}
        for k, p in self.procs.items():
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.terminate()
                try:
                    p.wait(3.0)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            codes[k] = p.returncode
        if self.connected:
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        self.log.emit("workers_stopped", reason=reason, sent_stop=sent_stop, exit_codes=codes)


# ------------------------------------------------------------------ ranks 1..W-1
def _compute_round(log: EventLog, cfg: RunConfig, trainer: "SiteTrainer", corpus: Any, order: np.ndarray, spr: int,
                   rank: int, world: int, rnd: int, n: int, idx: int, cs: int, ce: int) -> tuple[list[float], int]:
    """This rank's slice of every inner step of round `rnd` (one `worker_compute` span): (losses, samples)."""
    from site_agent.data import batch_for
    from site_agent.lr_schedule import step_frontier_tokens
    from ground.schedule import ids_at, site_positions

    losses, samples = [], 0
    with log.span("worker_compute", round=rnd) as sp:
        for h in range(1 if cfg.train.mode == "sync" else spr):
            site_ids = ids_at(order, site_positions(cfg, n, cs, h, idx, ce))
            if not site_ids:
                continue  # the cut last round: rank 0 skips this step too
            ids = rank_slice(site_ids, rank, world)
            samples += len(ids)
            x, y = batch_for(corpus, ids, cfg.model.seq_len)
            if cfg.train.mode == "sync":
                loss, _ = trainer.compute_grads(x, y)
            else:
                loss = trainer.inner_step(x, y, frontier_tokens=step_frontier_tokens(cfg, n, cs, h, ce))
            losses.append(loss)
        sp.update(samples=samples, site_loss=float(np.mean(losses)) if losses else None)
    return losses, samples


def _apply_round(log: EventLog, cfg: RunConfig, trainer: "SiteTrainer", world: int, rnd: int, cs: int,
                 losses: list[float], samples: int) -> None:
    """Apply rank 0's broadcast vector as rank 0 does, and report this rank's hash to it."""
    avg = _broadcast(torch.empty(trainer.global_params.numel(), dtype=torch.float32)).numpy()
    if cfg.train.mode == "sync":  # the same frontier rank 0 steps at: the round's start
        trainer.apply_grads(avg, frontier_tokens=cs * cfg.model.seq_len)
    else:
        trainer.apply_outer(avg, frontier_tokens=cs * cfg.model.seq_len)
    phash = trainer.params_hash()
    hashes = gather_hashes(phash, world)
    log.emit("worker_round", round=rnd, param_hash=phash, agrees_with_rank0=hashes[0] == phash,
             samples=samples, site_loss=float(np.mean(losses)) if losses else None)


def _serve_rounds(log: EventLog, cfg: RunConfig, trainer: "SiteTrainer", corpus: Any, order: np.ndarray, spr: int,
                  rank: int, world: int) -> str:
    """Follow rank 0's control messages (rounds, state loads) until STOP; returns why the worker stops."""
    while True:
        rnd, flag, n, idx, epoch, cs, ce = recv_control()
        if flag == STOP:
            return "stop from rank 0"
        if flag == STATE:
            _load_state(trainer, cs)
            continue
        if flag != ROUND:
            raise IntraSiteError(f"expected a ROUND control, got flag {flag} (round {rnd})")
        log.set_context(epoch=epoch, step=rnd * spr)
        losses, samples = _compute_round(log, cfg, trainer, corpus, order, spr, rank, world, rnd, n, idx, cs, ce)
        r2, flag, _n, _i, _e, nbytes, _ = recv_control()
        if flag == STOP:
            return f"stop from rank 0 before applying round {rnd}"
        if flag == STATE:  # the round was abandoned (a new epoch): take rank 0's state instead
            _load_state(trainer, nbytes)
            continue
        if flag != APPLY or r2 != rnd:
            raise IntraSiteError(f"expected APPLY for round {rnd}, got flag {flag} round {r2}")
        _apply_round(log, cfg, trainer, world, rnd, cs, losses, samples)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m site_agent.worker", description=__doc__)
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--site", required=True)
    ap.add_argument("--rank", required=True, type=int)
    ap.add_argument("--world", required=True, type=int)
    ap.add_argument("--master-port", required=True, type=int)
    args = ap.parse_args(argv)
    # Ctrl-C reaches the whole process group: rank 0 decides when its workers stop. SIGTERM keeps
    # its default action (exit at once), also while blocked inside a gloo call.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    from site_agent.data import load_corpus, sample_order
    from site_agent.model import pick_device
    from ground.schedule import steps_per_round
    from site_agent.init_state import start_trainer
    from ground.config import config_from_json

    cfg = config_from_json(args.run_dir / "config.json")
    rank, world, site = args.rank, args.world, args.site
    if not 0 < rank < world or world != cfg.train.workers_per_site:
        print(f"error: rank {rank} / world {world} does not fit workers_per_site={cfg.train.workers_per_site}",
              file=sys.stderr)
        return 2
    check_workers(cfg)
    me = f"{site}.w{rank}"
    log = EventLog(args.run_dir / "logs" / f"{me}.jsonl", cfg.run_id, me)
    threads = threads_per_worker(cfg)
    torch.set_num_threads(threads)
    device = pick_device(cfg.train.device)
    corpus = load_corpus(cfg.data)
    order = sample_order(corpus, cfg.model.seq_len, cfg.data.shuffle_seed)
    spr = steps_per_round(cfg)
    log.emit("worker_started", rank=rank, world=world, site=site, threads=threads, device=str(device),
             pid=os.getpid(), parent_pid=os.getppid())
    rc, reason = 0, "stop from rank 0"
    joined = False
    try:
        with log.span("intra_site_join", master_port=args.master_port):
            _init_group(rank, world, args.master_port, group_timeout(cfg))
        joined = True
        trainer = start_trainer(cfg, device, group=dist.group.WORLD)
        gather_hashes(trainer.params_hash(), world)  # the initial check (round -1), judged by rank 0
        reason = _serve_rounds(log, cfg, trainer, corpus, order, spr, rank, world)
    except IntraSiteError as e:
        rc, reason = 1, str(e)
    except Exception as e:  # a bug or a failed join: log it, show the traceback in <site>.w<k>.out
        import traceback

        traceback.print_exc()
        rc, reason = 1, f"{type(e).__name__}: {e}"
    finally:
        if joined:
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        log.emit("worker_stopped", reason=reason, rc=rc)
        log.close()
    return rc


if __name__ == "__main__":
    code = main()
    # Skip interpreter finalization: with torch loaded it spends about a CPU-second in module GC
    # (measured; several seconds on a loaded machine), which only delays rank 0's wait. The log
    # is closed and the group destroyed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
