"""The learning section's pure parts: pairing baselines with the eval set, the report's verdict
words, and the NLL chart with and without baselines (older logs must never crash it)."""

from __future__ import annotations

from analysis import figures
from analysis.learning import run_baselines, verdict

SET = "ab" * 32


def _bev(eval_set: str = SET, **extra) -> dict:
    return {"event": "baselines", "id": "launcher-7", "dataset_id": "d" * 64, "eval_set": eval_set, "eval_tokens": 16384,
            "baselines": {"unigram": {"nll": 3.2, "nll_se": 0.03, "model": "u"},
                          "bigram": {"nll": 2.5, "nll_se": 0.03, "model": "b"},
                          "kn5": {"nll": 1.5, "nll_se": 0.04, "model": "k"}}, **extra}


def _evals(*nll: float, eval_set: str | None = SET) -> list[dict]:
    return [{"event": "eval", "heldout_nll": v, **({"eval_set": eval_set} if eval_set else {})} for v in nll]


def _runs(*finals: float, b: dict | None = None) -> list[dict]:
    base = b if b is not None else run_baselines([_bev()], _evals(1.0))
    return [{"policy": p, "final_nll": f, "baselines": base} for p, f in zip(["stall", "restart", "elastic", "oracle"], finals)]


def test_baselines_are_paired_with_the_eval_set_or_refused() -> None:
    b = run_baselines([_bev()], _evals(5.5, 2.0))
    assert b["evidence"] == "measured" and b["eval_set"] == SET and b["event_id"] == "launcher-7"
    assert b["models"]["bigram"] == {"value": 2.5, "unit": "nats/token", "evidence": "measured", "se": 0.03, "model": "b"}
    assert run_baselines([], _evals(2.0))["evidence"] == "unavailable"  # older logs: no event
    assert "different" not in run_baselines([], _evals(2.0))["reason"]
    other = run_baselines([_bev("cd" * 32)], _evals(2.0))
    assert other["evidence"] == "unavailable" and "cdcdcdcdcdcd" in other["reason"]  # other windows: refused
    assert run_baselines([_bev()], _evals(2.0, eval_set=None))["evidence"] == "unavailable"  # eval names no set
    assert run_baselines([{"event": "baselines", "error": "OSError: x"}], _evals(2.0))["evidence"] == "unavailable"


def test_verdict_learned_gives_the_gap_below_the_bigram() -> None:
    v = verdict(_runs(2.1, 2.2))
    assert v["status"] == "learned"
    assert v["text"].startswith("The runs ended 0.30-0.40 nats below the bigram baseline (2.500 nats/token).")
    assert "The best run ended 0.60 nats above the kn5 n-gram baseline (1.500)." in v["text"]
    one = verdict(_runs(2.1))
    assert one["text"].startswith("The run ended 0.40 nats below the bigram baseline") and " It ended 0.60" in one["text"]
    assert "below the kn5" in verdict(_runs(1.4))["text"]


def test_verdict_never_passed_the_unigram_means_no_comparison() -> None:
    v = verdict(_runs(3.3, 3.25))
    assert v == {"status": "no_learning", "text": "The runs never passed the unigram baseline (3.200 nats/token): "
                                                  "no learning comparison is possible."}
    some = verdict(_runs(2.0, 3.2))  # equal to the unigram is not passing it
    assert some["status"] == "no_learning" and some["text"].startswith("1 of 2 runs (restart) never passed")


def test_verdict_between_unigram_and_bigram_is_weak() -> None:
    v = verdict(_runs(2.0, 2.7, 2.5))
    assert v["status"] == "weak" and v["text"].startswith("2 of 3 runs (restart, elastic) ended between the unigram (3.200)")
    assert "baselines: they learned little" in v["text"]
    assert "baselines: it learned little beyond byte frequencies" in verdict(_runs(2.9))["text"]


def test_verdict_without_baselines_or_nll_says_unavailable() -> None:
    missing = {"evidence": "unavailable", "reason": "no baselines event in the logs (the run predates them)"}
    v = verdict(_runs(2.0, b=missing))
    assert v["status"] == "unavailable" and "Baselines are unavailable (no baselines event" in v["text"]
    assert verdict(_runs(None))["status"] == "unavailable"  # type: ignore[arg-type]
    mixed = _runs(2.0, 2.1)
    mixed[1] = {**mixed[1], "baselines": {**mixed[1]["baselines"], "eval_set": "ef" * 32}}
    assert "different evaluation sets" in verdict(mixed)["text"]


def _art_run(policy: str, baselines: dict | None, se: float | None = 0.03) -> dict:
    curve = [{"t_s": t, "heldout_nll": v, "heldout_nll_se": se, "event_id": f"a-{t}", "useful_tokens_trained": 0}
             for t, v in ((0.0, 5.5), (4.0, 2.2))]
    learning = {"curve": curve, **({"baselines": baselines} if baselines is not None else {})}
    return {"policy": policy, "learning": learning}


def test_chart_draws_labelled_baselines_once_and_extra_references() -> None:
    b = run_baselines([_bev()], _evals(2.0))
    fig = figures.learning_figure([_art_run("stall", b), _art_run("elastic", b)],
                                  references=[{"name": "noise floor", "y": 2.0}],
                                  curves=[{"name": "one process", "x": [0, 4], "y": [5.5, 1.9]}])
    names = [t.name for t in fig.data]
    assert names == ["stall", "elastic", "one process", "unigram baseline", "bigram baseline", "kn5 baseline", "noise floor"]
    lines = {t.name: t for t in fig.data}
    assert list(lines["bigram baseline"].y) == [2.5, 2.5] and list(lines["bigram baseline"].x) == [0.0, 4.0]
    assert list(lines["stall"].error_y.array) == [0.03, 0.03]
    labels = [a.text for a in fig.layout.annotations]
    assert "bigram baseline 2.500" in labels and not any("unavailable" in t for t in labels)


def test_chart_of_older_logs_says_baselines_unavailable() -> None:
    for b in (None, {"evidence": "unavailable", "reason": "no baselines event in the logs (the run predates them)"}):
        fig = figures.learning_figure([_art_run("stall", b, se=None)])
        assert [t.name for t in fig.data] == ["stall"]
        assert any(a.text.startswith("baselines unavailable") for a in fig.layout.annotations)
