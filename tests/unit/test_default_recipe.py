"""The defaults a person meets learn (issue 56): `xdc run`, `xdc compare`, `xdc prepare` (compose) and
`xdc config` start from the recipe (xdc/cli.py RECIPE), not from the small dataclass defaults the
tests and the simulator pin. Pure config resolution: nothing starts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from ground.config import load_config, read_config_file, to_dict
from xdc.cli import DEMO, RECIPE, _resolve, main as xdc_main

ROOT = Path(__file__).resolve().parents[2]


def test_xdc_config_with_no_options_prints_the_recipe_that_learns(capsys: pytest.CaptureFixture[str]) -> None:
    assert xdc_main(["config"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["model"]["n_layers"] == 2
    t = cfg["train"]
    assert (t["target_useful_tokens"], t["per_site_batch"], t["inner_steps_h"], t["lr_warmup_tokens"]) == \
        (1_179_648, 2, 32, 65_536)


def test_a_set_or_a_config_file_still_wins_over_the_recipe(tmp_path: Path) -> None:
    conf = tmp_path / "mine.yaml"
    conf.write_text("train:\n  inner_steps_h: 8\n")
    args = argparse.Namespace(config=str(conf), set=["train.target_useful_tokens=65536"], runs_dir=None)
    cfg = load_config(_resolve(args, RECIPE))
    assert (cfg.train.inner_steps_h, cfg.train.target_useful_tokens, cfg.train.per_site_batch) == (8, 65_536, 2)


def test_the_compose_run_is_the_demo_recipe_and_wan() -> None:
    """compose/run.yaml adds only the demo's WAN to the recipe `xdc prepare` starts from."""
    args = argparse.Namespace(config=str(ROOT / "compose" / "run.yaml"), set=[], runs_dir=None)
    assert to_dict(load_config(_resolve(args, RECIPE))) == to_dict(load_config(DEMO))
    assert set(read_config_file(str(ROOT / "compose" / "run.yaml"))) == {"wan"}


def test_the_fork_server_serves_cpu_sites_only(monkeypatch) -> None:
    """A CUDA driver initialised before a fork is unusable after it: on a machine with an NVIDIA device
    node, sites that may pick the GPU start cold, and the launcher says why."""
    from cluster.launcher import why_no_fork

    cfg = load_config(RECIPE)
    assert cfg.cluster.fork_server
    monkeypatch.setattr("os.path.exists", lambda p: p == "/dev/nvidiactl")
    assert "start cold" in why_no_fork(cfg)  # device auto, a GPU present
    assert why_no_fork(load_config({**RECIPE, "train": {**RECIPE["train"], "device": "cpu"}})) is None
    monkeypatch.setattr("os.path.exists", lambda p: False)
    assert why_no_fork(cfg) is None  # auto without a GPU: the CPU
    assert "start cold" in why_no_fork(load_config({**RECIPE, "train": {**RECIPE["train"], "device": "cuda"}}))
