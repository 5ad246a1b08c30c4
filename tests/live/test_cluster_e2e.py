"""End to end: three real site processes, a coordinator and a store, through the real Toxiproxy.

These start real OS processes, real toxiproxy-server and real ZeroMQ sockets; they fail
(never skip) when any of them cannot start.
"""

from __future__ import annotations

import numpy as np
import torch

from site_agent.collective import reduce_in_order
from site_agent.data import batch_for, load_corpus, sample_order
from site_agent.lr_schedule import inner_lr_at
from ground.schedule import ids_at, rounds_for_target, samples_per_round, site_positions, target_samples
from site_agent.trainer import SiteTrainer
from tests.conftest import assert_ledger_balanced, events
from wan.frames import TRAFFIC_CLASSES
from ground.config import config_from_json
from analysis.checkers import HANDSHAKE_BOUND_B, heartbeat_bound_b_per_s

# Bytes no traffic class owns: per connection, the ZMTP greeting and CURVE handshake
# (HELLO 200 B, WELCOME 168 B, INITIATE ~260 B + metadata, READY + metadata: under 2 KiB),
# and ZMTP heartbeats (encrypted PING/PONG, both directions: analysis/checkers.py says how).


def _duration_s(run_dir) -> float:
    ev = events(run_dir, "launcher")
    return (ev[-1]["mono_ns"] - ev[0]["mono_ns"]) / 1e9


def test_three_sites_train_through_toxiproxy_with_latency(local_run):
    run_dir, s = local_run
    assert s["clean_exit"], s["exit_codes"]
    assert all(rc == 0 for rc in s["exit_codes"].values())
    assert s["useful_tokens"] >= s["target_useful_tokens"] == 36_864
    # The work ledger balances exactly and nothing was lost in a fault-free run.
    assert_ledger_balanced(run_dir, s)  # site logs against the commit record, and the summary agrees
    assert s["lost_tokens"] == 0 and s["retained_tokens"] == s["useful_tokens"]
    # Held-out NLL falls.
    curve = [p["heldout_nll"] for p in s["heldout_nll_curve"]]
    assert len(curve) >= 4  # the initial weights, then after every round
    assert curve[-1] < curve[0] - 1.0, curve
    # Every eval names its evaluation set, and the launcher's baselines were measured on that same set.
    evals = [e for e in events(run_dir, "a") + events(run_dir, "b") + events(run_dir, "c") if e["event"] == "eval"]
    assert {e["eval_set"] for e in evals} == {s["eval_set"]} and len(s["eval_set"]) == 64
    assert all(e["eval_tokens"] == 128 * 128 and 0 < e["heldout_nll_se"] < 0.2 for e in evals), evals
    b = s["baselines"]
    assert b["evidence"] == "measured" and b["eval_set"] == s["eval_set"], b
    assert b["models"]["unigram"]["value"] > b["models"]["bigram"]["value"] > b["models"]["kn5"]["value"] > 0
    # All six classes are reported; traffic of a fault-free run is in the expected ones.
    assert set(s["bytes_by_class"]) == set(TRAFFIC_CLASSES)
    for cls in ("collective", "checkpoint", "control", "telemetry"):
        assert s["bytes_by_class"][cls] > 0, cls
    assert s["bytes_by_class"]["aborted_collective"] == 0
    assert s["bytes_by_class"]["state_transfer"] == 0
    # The latency toxic was really on every site link.
    launcher = events(run_dir, "launcher")
    site_links = [e for e in launcher if e["event"] == "proxy_created" and "coord" not in e["proxy"]
                  and "store" not in e["proxy"]]
    assert len(site_links) == 6 and all("shape_latency_up" in e["toxics"] for e in site_links)


def test_byte_classes_reconcile_with_toxiproxy_counters(local_run):
    run_dir, s = local_run
    rec = s["reconciliation"]
    assert rec["evidence"] == "measured"
    assert rec["counted_total"] == sum(s["bytes_by_class"].values())
    duration = _duration_s(run_dir)
    # Every link: the proxy saw at least what we counted, and the rest is bounded framing overhead.
    for link, row in rec["per_link"].items():
        bound = HANDSHAKE_BOUND_B + heartbeat_bound_b_per_s(s["config"]["wan"]["zmq_heartbeat_ivl_ms"]) * duration
        assert 0 <= row["overhead"] <= bound, (link, row, bound)
    assert rec["overhead_fraction"] < 0.01


def test_every_process_exits_cleanly_and_logs_the_event_contract(local_run):
    run_dir, s = local_run
    for proc in ("coord", "store", "a", "b", "c"):
        evs = events(run_dir, proc)
        assert evs, proc
        for i, e in enumerate(evs):
            assert e["id"] == f"{proc}:{i}"
            for key in ("wall_ns", "mono_ns", "run_id", "process", "epoch", "step"):
                assert key in e, (proc, key, e)
            assert e["run_id"] == s["run_id"]
        spans = [e for e in evs if "start_mono_ns" in e]
        assert all(e["end_mono_ns"] >= e["start_mono_ns"] and e["end_wall_ns"] >= e["start_wall_ns"] for e in spans)
    stops = [e for e in events(run_dir, "a") if e["event"] == "site_stopped"]
    assert stops and stops[-1]["reason"] == "completed"


def test_durable_frontier_is_the_final_checkpoint(local_run):
    run_dir, s = local_run
    durable = [e for e in events(run_dir, "store") if e["event"] == "checkpoint_durable"]
    assert len(durable) >= 2  # every 2 rounds and at the end, each with its parent
    assert durable[-1]["manifest_hash"] == s["frontier_manifest_hash"]
    assert durable[-1]["parent"] == durable[-2]["manifest_hash"]
    assert s["frontier_round"] == rounds_for_target(config_from_json(run_dir / "config.json"), 3) - 1
    assert s["frontier_hash"] and len(s["frontier_hash"]) == 64


def test_local_mode_moves_about_one_hth_of_sync_collective_bytes(local_run, sync_run):
    _, local = local_run
    _, sync = sync_run
    h = local["config"]["train"]["inner_steps_h"]
    # Same samples, same number of inner steps: sync reduces every step, local every H steps.
    assert local["useful_tokens"] == sync["useful_tokens"]
    ratio = local["bytes_by_class"]["collective"] / sync["bytes_by_class"]["collective"]
    assert abs(ratio - 1 / h) < 0.1 / h, ratio


def test_sync_run_matches_single_process_run_bitwise(sync_run):
    """Three sites in sync mode end with the weights of one process that sums the same
    per-site gradients in the same (site) order: deterministic reduction makes it bitwise."""
    run_dir, s = sync_run
    assert s["clean_exit"], s["exit_codes"]
    cfg = config_from_json(run_dir / "config.json")
    sites = sorted(cfg.cluster.sites)
    n = len(sites)
    torch.set_num_threads(1)  # the sites ran with one thread each
    corpus = load_corpus(cfg.data)
    order = sample_order(corpus, cfg.model.seq_len, cfg.data.shuffle_seed)
    ref = SiteTrainer(cfg, torch.device("cpu"))
    steps = rounds_for_target(cfg, n)
    for step in range(steps):
        grads = []
        for i in range(n):
            ids = ids_at(order, site_positions(cfg, n, step * samples_per_round(cfg, n), 0, i, target_samples(cfg)))
            _, g = ref.compute_grads(*batch_for(corpus, ids, cfg.model.seq_len))
            grads.append(g.copy())
        # The lr of step k is the schedule's at the frontier before it: k x (3 sites x batch) samples.
        ref.apply_grads(reduce_in_order(grads), frontier_tokens=step * n * cfg.train.per_site_batch * cfg.model.seq_len)
    final = {}
    for site in sites:
        done = [e for e in events(run_dir, site) if e["event"] == "round_done"]
        assert len(done) == steps
        final[site] = done[-1]["param_hash"]
    assert len(set(final.values())) == 1, final
    assert final[sites[0]] == ref.params_hash()
    # And the equality is not vacuous: the model moved away from its initial weights.
    start = [e for e in events(run_dir, sites[0]) if e["event"] == "site_started"][0]["params_hash"]
    assert start != ref.params_hash()
    assert np.isfinite(s["final_heldout_nll"])
    # The schedule really moved the lr during this run (warm-up, then cosine decay), so the
    # equality above covers the scheduled lr, not a constant one.
    lrs = {inner_lr_at(cfg, k * n * cfg.train.per_site_batch * cfg.model.seq_len) for k in range(steps)}
    assert len(lrs) == steps and cfg.train.lr_schedule == "cosine", lrs


def test_a_step_floor_slows_every_step_to_the_emulated_device_and_changes_nothing_learned(local_run, tmp_path):
    """`train.step_floor_ms` emulates a slower device per site (the storm benchmark charges each site
    its own compute this way): every inner step takes at least the floor, and since it only waits,
    the run commits exactly the same states as the same run without it."""
    from tests.conftest import run_cluster

    floor_ms = 300.0
    run_dir, s = run_cluster(tmp_path, {"train": {"mode": "local", "step_floor_ms": floor_ms}})
    assert s["clean_exit"] and s["useful_tokens"] == local_run[1]["useful_tokens"]
    waited = 0.0
    for site in ("a", "b", "c"):
        spans = [e for e in events(run_dir, site) if e["event"] == "compute"]
        steps = {(e["round"], e["inner_step"]) for e in events(run_dir, site) if e["event"] == "work_attempted"}
        assert spans and len(steps) == 12  # 3 rounds x H = 4
        for sp in spans:
            took_s = (sp["end_mono_ns"] - sp["start_mono_ns"]) / 1e9
            assert took_s >= 4 * floor_ms / 1000, (site, sp["round"], took_s)
            waited += sp["floor_wait_s"]
    assert waited > 0  # the host computed faster than the floor at least once: the floor did the waiting

    def commits(rd):
        return [(e["commit_id"], e["param_hash"]) for e in events(rd, "coord") if e["event"] == "commit"]
    assert commits(run_dir) == commits(local_run[0]) and len(commits(run_dir)) == 3
