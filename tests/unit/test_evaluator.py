"""The leader's background evaluation logs the number the inline evaluation gives, for the weights
the model held when it was submitted, and every submitted evaluation is logged."""

from __future__ import annotations

import json

import torch

from site_agent.data import batch_for, eval_fields, eval_set, load_corpus, sample_order
from site_agent.evaluator import BackgroundEval
from site_agent.trainer import SiteTrainer
from ground.config import load_config
from ground.eventlog import EventLog


def test_background_eval_equals_inline_eval_of_the_submitted_weights(tmp_path):
    torch.set_num_threads(1)
    cfg = load_config({"train": {"mode": "local", "per_site_batch": 4},
                       "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": 32},
                       "data": {"eval_windows": 8}})
    corpus = load_corpus(cfg.data)
    order = sample_order(corpus, cfg.model.seq_len, cfg.data.shuffle_seed)
    es = eval_set(corpus, cfg.data, cfg.model.seq_len)
    hx, hy = es.tensors()
    t = SiteTrainer(cfg, torch.device("cpu"))
    log = EventLog(tmp_path / "a.jsonl", "r", "a")
    ev = BackgroundEval(t.model, log, 1, lambda m: eval_fields(m, es, hx, hy, t.device))
    expected = []
    for r in range(3):
        t.inner_step(*batch_for(corpus, order[4 * r:4 * r + 4], cfg.model.seq_len), frontier_tokens=4 * r * 32)
        expected.append(eval_fields(t.model, es, hx, hy, t.device)["heldout_nll"])  # inline, as the agent did
        ev.submit(r, {"useful_tokens_trained": (r + 1) * 128})
        # The live model moves on while the evaluation runs: the evaluation must not see it.
        t.inner_step(*batch_for(corpus, order[100 + 4 * r:104 + 4 * r], cfg.model.seq_len), frontier_tokens=(4 * r + 2) * 32)
    ev.wait()
    log.close()
    assert ev.error is None
    spans = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    spans = [e for e in spans if e["event"] == "eval"]
    assert [e["round"] for e in spans] == [0, 1, 2]
    assert [e["heldout_nll"] for e in spans] == expected  # bitwise: the same float
    assert [e["useful_tokens_trained"] for e in spans] == [128, 256, 384]
    assert {e["eval_set"] for e in spans} == {es.eval_set_id} and all(e["heldout_nll_se"] > 0 for e in spans)
    assert t.model.training  # the live model was never switched to eval mode
