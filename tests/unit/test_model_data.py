"""Unit tests for the site model (site_agent/model.py) and the stdlib corpus (site_agent/data.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from site_agent import data as D
from site_agent.model import (
    build_model,
    count_params,
    flat_grads,
    flat_params,
    load_flat_grads_,
    load_flat_params_,
    measure_flops_per_token,
    params_hash,
    pick_device,
    state_hash,
)
from ground.config import DataConfig, ModelConfig

torch.set_num_threads(1)

CFG = ModelConfig()
DCFG = DataConfig()


@pytest.fixture(scope="module")
def corpus() -> D.Corpus:
    return D.load_corpus(DCFG)


# ---------------------------------------------------------------- model


def test_same_seed_same_hash_different_seed_different() -> None:
    h0 = params_hash(build_model(CFG, seed=0))
    assert params_hash(build_model(CFG, seed=0)) == h0
    assert params_hash(build_model(CFG, seed=1)) != h0


def test_build_model_leaves_global_rng_alone() -> None:
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    build_model(CFG, seed=3)
    assert torch.equal(torch.rand(3), expected)


def test_param_count_of_default_config() -> None:
    n = count_params(build_model(CFG, seed=0))
    assert 700_000 <= n <= 1_200_000


def test_flops_per_token_measured_and_model_untouched() -> None:
    model = build_model(CFG, seed=0)
    before = params_hash(model)
    fpt = measure_flops_per_token(model, CFG, batch=2)
    n = count_params(model)
    assert fpt > 0
    assert 0.5 * 6 * n <= fpt <= 2.0 * 6 * n
    assert params_hash(model) == before
    assert all(p.grad is None for p in model.parameters())


def test_forward_shapes_and_initial_loss_near_uniform() -> None:
    model = build_model(CFG, seed=0)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (2, CFG.seq_len), generator=g)
    y = torch.randint(0, 256, (2, CFG.seq_len), generator=g)  # independent of x (tied head)
    logits, loss = model(x, y)
    assert logits.shape == (2, CFG.seq_len, CFG.vocab_size)
    assert loss is not None and abs(loss.item() - math.log(256)) < 0.1  # small init: ~uniform
    _, none_loss = model(x)
    assert none_loss is None


def test_causal_prefix_independent_of_future_tokens() -> None:
    model = build_model(CFG, seed=0)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (1, 16), generator=g)
    x2 = x.clone()
    x2[0, 10:] = (x2[0, 10:] + 1) % 256
    with torch.no_grad():
        a, _ = model(x)
        b, _ = model(x2)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6)
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_flat_params_round_trip_bit_exact() -> None:
    src = build_model(CFG, seed=0)
    dst = build_model(CFG, seed=1)
    flat = flat_params(src)
    assert flat.dtype == torch.float32 and flat.shape == (count_params(src),)
    load_flat_params_(dst, flat)
    assert params_hash(dst) == params_hash(src)
    assert torch.equal(flat_params(dst), flat)
    with pytest.raises(ValueError):
        load_flat_params_(dst, flat[:-1])


def test_flat_grads_match_and_round_trip(corpus: D.Corpus) -> None:
    model = build_model(CFG, seed=0)
    x, y = D.batch_for(corpus, [0, 1], CFG.seq_len)
    _, loss = model(x, y)
    loss.backward()
    flat = flat_grads(model)
    offset = 0
    for _, p in model.named_parameters():
        assert torch.equal(flat[offset : offset + p.numel()], p.grad.reshape(-1))
        offset += p.numel()
    assert offset == flat.numel()
    other = build_model(CFG, seed=1)
    load_flat_grads_(other, flat * 2)
    assert torch.equal(flat_grads(other), flat * 2)


def test_state_hash_sorted_and_sensitive() -> None:
    a = {"x": torch.ones(3), "step": torch.tensor(5.0)}
    b = {"step": torch.tensor(5.0), "x": torch.ones(3)}
    assert state_hash(a) == state_hash(b)
    assert state_hash(a) != state_hash({"x": torch.ones(3), "step": torch.tensor(6.0)})
    assert state_hash(a) != state_hash({"x": torch.ones(3, dtype=torch.float64), "step": torch.tensor(5.0)})


def test_pick_device_auto() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert pick_device("auto").type == expected
    assert pick_device("cpu").type == "cpu"


def test_adamw_steps_lower_training_loss(corpus: D.Corpus) -> None:
    torch.manual_seed(0)
    model = build_model(CFG, seed=0)
    x, y = D.batch_for(corpus, list(range(8)), CFG.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    losses = []
    for _ in range(15):
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0, losses
    nll = D.evaluate_nll(model, x, y, torch.device("cpu"), batch=3)
    assert model.training
    assert nll < losses[0] - 1.0


# ---------------------------------------------------------------- data


def test_corpus_split_by_document(corpus: D.Corpus) -> None:
    assert len(corpus.train) > 0 and len(corpus.heldout) > 0
    docs = D._read_documents(D.stdlib_dir(), DCFG.max_corpus_bytes)
    assert corpus.n_docs_train + corpus.n_docs_heldout == len(docs)
    assert corpus.n_docs_heldout == len(docs[:: DCFG.heldout_every_docs])
    held = [d for k, (_, d) in enumerate(docs) if k % DCFG.heldout_every_docs == 0]
    train = [d for k, (_, d) in enumerate(docs) if k % DCFG.heldout_every_docs != 0]
    assert corpus.heldout.tobytes() == b"".join(d + b"\0" for d in held)
    assert corpus.train.tobytes() == b"".join(d + b"\0" for d in train)
    assert len(corpus.train) + len(corpus.heldout) <= DCFG.max_corpus_bytes
    # the first document (held out) does not leak into train
    first = docs[0][1]
    assert len(first) > 1000 and first not in corpus.train.tobytes()
    paths = [p for p, _ in docs]
    assert paths == sorted(paths)
    for p in paths:
        assert p.endswith(".py")
        assert not set(p.split("/")[:-1]) & D.EXCLUDED_DIRS, p


def test_dataset_id_stable_across_loads(corpus: D.Corpus) -> None:
    D._CACHE.clear()
    again = D.load_corpus(DCFG)
    assert again is not corpus
    assert again.dataset_id == corpus.dataset_id
    assert np.array_equal(again.train, corpus.train)
    assert D.load_corpus(DCFG) is again  # cached
    other = D.load_corpus(DataConfig(max_corpus_bytes=1_000_000))
    assert other.dataset_id != corpus.dataset_id


def test_n_samples_and_order(corpus: D.Corpus) -> None:
    n = D.n_samples(corpus, CFG.seq_len)
    assert n > 1000
    assert n * CFG.seq_len + 1 <= len(corpus.train) < (n + 1) * CFG.seq_len + 1
    order = D.sample_order(corpus, CFG.seq_len, DCFG.shuffle_seed)
    assert order.dtype == np.int64
    assert np.array_equal(np.sort(order), np.arange(n))
    assert np.array_equal(order, D.sample_order(corpus, CFG.seq_len, DCFG.shuffle_seed))
    assert not np.array_equal(order, np.arange(n))


def test_batch_for_shapes_and_shift(corpus: D.Corpus) -> None:
    T = CFG.seq_len
    n = D.n_samples(corpus, T)
    ids = [0, 5, n - 1]
    x, y = D.batch_for(corpus, ids, T)
    assert x.shape == y.shape == (3, T)
    assert x.dtype == y.dtype == torch.int64 and x.device.type == "cpu"
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row, s in enumerate(ids):
        window = torch.from_numpy(corpus.train[s * T : s * T + T + 1].astype(np.int64))
        assert torch.equal(x[row], window[:-1]) and torch.equal(y[row], window[1:])
    with pytest.raises(IndexError):
        D.batch_for(corpus, [n], T)


def test_eval_starts_spread_evenly() -> None:
    assert D.eval_starts(1000, 3, 9).tolist() == [0, 495, 990]  # first and last full window (990 + 10 = 1000)
    s = D.eval_starts(100_000, 50, 128)
    assert s[0] == 0 and s[-1] == 100_000 - 129 and (np.diff(s) >= 128).all()  # no overlap
    assert D.eval_starts(1000, 1, 9).tolist() == [0]
    with pytest.raises(ValueError):
        D.eval_starts(1000, 112, 9)  # room for 111 windows only


def test_eval_set_covers_every_heldout_document(corpus: D.Corpus) -> None:
    es = D.eval_set(corpus, DCFG, CFG.seq_len)
    assert es.windows.shape == (DCFG.eval_windows, CFG.seq_len + 1) and es.tokens == DCFG.eval_windows * CFG.seq_len
    assert es.n_docs_covered == es.n_docs_heldout == corpus.n_docs_heldout  # every held-out document sampled
    for row in (0, DCFG.eval_windows // 2, DCFG.eval_windows - 1):
        s = es.starts[row]
        assert es.windows[row].tobytes() == corpus.heldout[s : s + CFG.seq_len + 1].tobytes()
    x, y = es.tensors()
    assert x.shape == y.shape == (DCFG.eval_windows, CFG.seq_len) and torch.equal(x[:, 1:], y[:, :-1])
    # identity: the same windows give the same id; other windows another; the dataset id ignores the count
    again = D.eval_set(corpus, DCFG, CFG.seq_len)
    assert again.eval_set_id == es.eval_set_id and len(es.eval_set_id) == 64
    other_cfg = DataConfig(eval_windows=DCFG.eval_windows // 2)
    assert D.eval_set(corpus, other_cfg, CFG.seq_len).eval_set_id != es.eval_set_id
    assert D.load_corpus(other_cfg).dataset_id == corpus.dataset_id


def test_per_window_nll_and_its_standard_error(corpus: D.Corpus) -> None:
    model = build_model(CFG, 0)
    x, y = D.batch_for(corpus, list(range(6)), CFG.seq_len)
    per = D.evaluate_windows(model, x, y, torch.device("cpu"), batch=4)
    assert per.shape == (6,)
    with torch.no_grad():
        _, loss = model(x, y)  # the model's own mean over all tokens
    assert per.mean() == pytest.approx(float(loss), rel=1e-5)
    assert D.evaluate_nll(model, x, y, torch.device("cpu")) == pytest.approx(float(loss), rel=1e-5)
    mean, se = D.nll_stats(np.array([1.0, 2.0, 3.0]))
    assert mean == 2.0 and se == pytest.approx(1 / math.sqrt(3))  # sample sd 1, n = 3
    es = D.eval_set(corpus, DataConfig(eval_windows=8), CFG.seq_len)
    f = D.eval_fields(model, es, *es.tensors(), torch.device("cpu"))
    assert f["eval_set"] == es.eval_set_id and f["eval_tokens"] == 8 * CFG.seq_len
    assert f["heldout_nll_se"] > 0 and f["eval_cpu_s"] >= 0
    assert f["heldout_nll"] == pytest.approx(D.evaluate_nll(model, *es.tensors(), torch.device("cpu")))
