"""The count-based baselines: answers computed by hand on tiny corpora, and KN's normalisation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from site_agent import baselines as B


def _b(s: str) -> np.ndarray:
    return np.frombuffer(s.encode("latin-1"), dtype=np.uint8)


def _w(*rows: str) -> np.ndarray:
    return np.stack([_b(r) for r in rows])  # uint8 [N, T+1]


def test_unigram_add_one_by_hand() -> None:
    # "aab": c(a) = 2, c(b) = 1, N = 3 -> P(b) = 2/259, P(a) = 3/259, P(z) = 1/259
    nll = B.unigram_nll(_b("aab"), _w("ab", "ba", "az"))
    assert nll == pytest.approx([-math.log(2 / 259), -math.log(3 / 259), -math.log(1 / 259)])
    # a window's NLL is the mean over its targets (the first byte is context only)
    assert B.unigram_nll(_b("aab"), _w("zab"))[0] == pytest.approx(-(math.log(3 / 259) + math.log(2 / 259)) / 2)


def test_bigram_add_one_by_hand() -> None:
    # "aab": bigrams aa, ab -> c(a .) = 2, c(ab) = 1; b is never followed by anything
    nll = B.bigram_nll(_b("aab"), _w("ab", "aa", "ba", "ac"))
    assert nll == pytest.approx([-math.log(2 / 258), -math.log(2 / 258), -math.log(1 / 256), -math.log(1 / 258)])


# "abab" by hand. Discounts n1/(n1+2 n2), clamped to [0.1, 0.9]:
#   raw bigrams ab:2, ba:1 -> D2 = 1/3. Continuation unigrams (distinct left neighbours): N(.b) = 1,
#   N(.a) = 1 over 2 distinct bigrams -> D = 1 -> 0.9:  Pc1(w) = max(N(.w) - 0.9, 0)/2 + 0.9 * 2/2 / 256.
PC1_A = 0.1 / 2 + 0.9 / 256
PC1_Z = 0.9 / 256  # a byte never seen


def test_kneser_ney_order2_by_hand() -> None:
    p = B.kneser_ney_prob(_b("abab"), _w("ab_", "za_", "az_", "bab"), order=2)
    assert p[0, 0] == pytest.approx((2 - 1 / 3) / 2 + (1 / 3) * 1 / 2 * PC1_A)  # P(b | a): c(ab) = 2, c(a.) = 2
    assert p[1, 0] == pytest.approx(PC1_A)  # unseen context z: everything passes down
    assert p[2, 0] == pytest.approx((1 / 3) * 1 / 2 * PC1_Z)  # seen context, unseen byte: never 0
    assert p[3, 0] == pytest.approx((1 - 1 / 3) / 1 + (1 / 3) * 1 / 1 * PC1_A)  # P(a | b): c(ba) = 1, c(b.) = 1
    assert p[3, 1] == pytest.approx(p[0, 0])  # order 2 only looks at the previous byte


def test_kneser_ney_order3_by_hand_and_short_context() -> None:
    # raw trigrams aba:1, bab:1 -> D3 = 0.9; continuation bigrams (distinct left neighbours): ba:1, ab:1
    # -> D = 0.9; context b: total 1, types 1 -> Pc2(a | b) = 0.1 + 0.9 * Pc1(a).
    p = B.kneser_ney_prob(_b("abab"), _w("aba"), order=3)
    pc2_a_b = 0.1 + 0.9 * PC1_A
    assert p[0, 1] == pytest.approx(0.1 / 1 + 0.9 * 1 / 1 * pc2_a_b)  # P(a | ab): c(aba) = 1, c(ab.) = 1
    # The first target has one byte of context: scored by order 2 as the top order (raw counts)
    assert p[0, 0] == pytest.approx(B.kneser_ney_prob(_b("abab"), _w("ab"), order=2)[0, 0])


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_kneser_ney_is_a_distribution(order: int) -> None:
    rng = np.random.default_rng(7)
    train = rng.choice(np.frombuffer(b"abcde \n", dtype=np.uint8), size=3000, p=[.3, .2, .15, .1, .1, .1, .05])
    for ctx in (b"abc", b"e \n", b"zzz"):  # seen, seen, unseen contexts
        rows = np.array([list(ctx) + [w] for w in range(256)], dtype=np.uint8)  # [256, 4]: every next byte
        p = B.kneser_ney_prob(train, rows, order)
        assert (p > 0).all()
        assert p[:, -1].sum() == pytest.approx(1.0, abs=1e-9)  # the last target has the full context


def test_higher_order_helps_on_repetitive_text_and_compute_baselines() -> None:
    text = _b("def f(x):\n    return x + 1\n" * 40)
    win = _w("def f(x):\n    return x + 1\n")
    nll = {k: B.kneser_ney_nll(text, win, k)[0] for k in (1, 2, 3, 5)}
    assert nll[1] > nll[2] > nll[3] > nll[5]
    out = B.compute_baselines(text, np.concatenate([win, win]), kn_order=5)
    assert set(out["baselines"]) == {"unigram", "bigram", "kn5"}
    assert out["baselines"]["kn5"]["nll"] == pytest.approx(nll[5])
    assert out["baselines"]["unigram"]["nll"] == pytest.approx(B.unigram_nll(text, win)[0])
    assert out["baselines"]["bigram"]["nll_se"] == 0.0  # two identical windows
