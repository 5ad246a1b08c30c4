"""The warm standby's preparation (site_agent/standby.py): warm, but nothing a cold site would not have."""

from __future__ import annotations

import io

import pytest
import torch

from ground.config import load_config
from site_agent.standby import prepare, wait_for_site
from site_agent.trainer import SiteTrainer

SMALL = {"model": {"d_model": 32, "n_layers": 1, "n_heads": 2}, "train": {"device": "cpu", "per_site_batch": 2}}


@pytest.fixture(scope="module")
def prepared():
    """One preparation for the tests that only read it (loading the corpus takes seconds)."""
    cfg = load_config(SMALL)
    return cfg, prepare(cfg)


def test_a_prepared_standby_holds_exactly_what_a_cold_site_builds_and_leaves_the_rng_alone():
    cfg = load_config(SMALL)
    torch.manual_seed(1234)
    rng_before = torch.random.get_rng_state()
    warm = prepare(cfg)
    assert torch.equal(torch.random.get_rng_state(), rng_before), "the warm-up consumed the RNG"
    cold = SiteTrainer(cfg, torch.device("cpu"))
    assert warm.trainer.params_hash() == cold.params_hash()
    assert warm.trainer.inner_steps == 0 and not warm.trainer.inner_opt.state  # the copy trained, not it
    assert all(p.grad is None for p in warm.trainer.model.parameters())
    assert warm.ready_mono_ns > warm.started_mono_ns


def test_the_standby_becomes_the_site_it_is_told_and_exits_quietly_at_end_of_input(prepared):
    cfg, warm = prepared
    assert wait_for_site(cfg, warm, io.StringIO("b\n")) == "b"
    t = warm.timing()
    assert t["assigned_mono_ns"] >= t["ready_mono_ns"] and t["prepare_s"] > 0
    assert wait_for_site(cfg, warm, io.StringIO("")) is None


def test_a_standby_told_to_become_no_site_of_the_cluster_refuses(prepared, capsys):
    cfg, warm = prepared
    with pytest.raises(SystemExit) as e:
        wait_for_site(cfg, warm, io.StringIO("z\n"))
    assert e.value.code == 2
    assert "not a site of ['a', 'b', 'c']" in capsys.readouterr().err
