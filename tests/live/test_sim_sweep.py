"""Sweeps of the simulator (sim/sweep.py): local processes and a real Dask distributed cluster agree.

The Dask test starts a real LocalCluster (a scheduler and two worker processes over TCP on
localhost), runs a tiny sweep on it through its address, exactly as `xdc sim sweep --scheduler`
does, and checks the results equal the same sweep run on local worker processes (seeds fixed).
Without a reachable scheduler the sweep says so and runs nothing. The rest: tests/unit/test_sim_sweep.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from sim import sweep
from sim.cli import main as sim_main

TINY = dict(sites=[3], rates=[0.0, 40.0], bandwidths=[0], policies=["stall", "elastic"], modes=["local"],
            sim_s=90.0, repair_s=20.0, seed=7, seeds=2, rate_evidence="given")  # as --rates makes them


def test_a_sweep_on_a_real_local_dask_cluster_equals_the_local_process_sweep(tmp_path: Path, capsys) -> None:
    import distributed  # a dependency (pyproject), installed by `make setup`: missing is a failure, not a skip
    todo = sweep.cells(**TINY)
    told: list[tuple[int, int]] = []
    local = sweep.run_local(todo, workers=2, on_done=lambda k, n, r: told.append((k, n)))
    assert told == [(k, len(todo)) for k in range(1, len(todo) + 1)]  # each cell, as it finished
    assert any(r["faults"] for r in local) and all(r["useful_tokens"] > 0 for r in local)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  protocol="tcp", host="127.0.0.1") as cluster:
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        out = tmp_path / "sweep"
        args = ["sweep", "--sites", "3", "--rates", "0,40", "--policies", "stall,elastic", "--sim-s", "90",
                "--repair-s", "20", "--seed", "7", "--seeds", "2", "--scheduler", cluster.scheduler_address, "--out", str(out)]
        assert sim_main(args) == 0
        with distributed.Client(cluster.scheduler_address) as client:
            workers = client.scheduler_info()["workers"]
            assert len(workers) == 2  # two worker processes, not this one
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["where"].startswith("Dask cluster at tcp://")
    def same(r: dict) -> dict:  # what a cell's inputs fix (not the CPU time it took)
        return {k: v for k, v in r.items() if k not in ("goodput_ratio", "cell_cpu_s")}
    assert [same(r) for r in doc["results"]] == [same(r) for r in local]
    assert all(r["cell_cpu_s"] > 0 for r in doc["results"])
    err = capsys.readouterr().err
    assert f"[{len(todo)}/{len(todo)}] 3 sites" in err and "CPU-s)" in err  # the progress of a long sweep
    small = tmp_path / "small"  # the figure with plotly.js from its CDN: a file small enough to keep
    assert sim_main(["sweep", "--sites", "3", "--rates", "0", "--policies", "stall", "--sim-s", "30", "--workers", "1",
                     "--figure-js", "cdn", "--out", str(small)]) == 0
    page = (small / "goodput.html").read_text()
    assert len(page) < 100_000 and "cdn.plot.ly" in page and "Simulated goodput" in page
    assert (out / "goodput.html").stat().st_size > 10_000 and "| best |" in (out / "table.md").read_text()
    assert doc["failure_prior"]["evidence"] == "prior" and "Llama 3" in doc["failure_prior"]["source"]
    # --rates are the user's: labelled given, never prior (the table, the figure's axis, the summary)
    assert doc["failure_rates"]["evidence"] == "given" and "failures/site-h (given)" in doc["table_md"]


def test_a_sweep_given_no_reachable_scheduler_says_so_and_runs_nothing(tmp_path: Path, capsys, monkeypatch) -> None:
    import socket
    with socket.socket() as sock:  # a port nobody listens on (bound, never listening: refused at once)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        monkeypatch.setattr(sweep, "SCHEDULER_TIMEOUT_S", 2)
        out = tmp_path / "sweep"
        for addr in (f"tcp://127.0.0.1:{port}", "not-an-address"):
            rc = sim_main(["sweep", "--sites", "3", "--rates", "0", "--policies", "stall", "--sim-s", "30",
                           "--scheduler", addr, "--out", str(out)])
            err = capsys.readouterr().err
            assert rc == 2 and f"no Dask scheduler reachable at {addr!r} within 2 s" in err and "Traceback" not in err
            assert not out.exists()  # nothing ran, nothing written
