"""The published page (`make report`): built from the committed results/ alone.

- every section is there in the seed's order, with its data-state and an opening sentence, whatever
  results/ holds (an empty folder gives seven `not-run` sections that say so);
- the committed page and the README's answers block are what `make report` builds from the committed
  results (so a fresh clone shows the same answers without running anything);
- the committed results name commits in this history, made from a clean tree, and stay under 25 MB.
The fresh clone: tests/live/test_results_page.py; the browser test of the same page:
tests/live/test_results_page_browser.py.
"""

from __future__ import annotations

from pathlib import Path

from xdc.publish import SECTIONS, STATES, commit_in_history, not_run
from xdc.results_page import README_END, README_START, load_results, readme_block, render
from tests.helpers_results_page import sections_of

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"


def test_an_empty_results_folder_gives_seven_sections_that_say_not_run(tmp_path):
    html = render(load_results(tmp_path))
    got = sections_of(html)
    assert [s for s, _, _ in got] == list(SECTIONS)
    assert all(state == "not-run" and sentence.startswith("not-run Not run: nothing is published") for _, state, sentence
               in got), got
    assert "loading" not in html.lower()


def test_a_section_without_a_result_states_why_and_how_to_make_one(tmp_path):
    not_run("energy-gpu", "energy-counter", "not-run", "the full-size study needs a GPU; none was available",
            "make study-cadence", tmp_path)
    got = dict((s, (state, sentence)) for s, state, sentence in sections_of(render(load_results(tmp_path))))
    assert got["energy-counter"] == ("not-run", "not-run Not run: the full-size study needs a GPU; none was available")


def test_the_committed_page_and_readme_block_are_what_make_report_builds():
    results = load_results(RESULTS)
    page = (RESULTS / "site" / "index.html").read_text(encoding="utf-8")
    assert page == render(results), "results/site/index.html is stale: run `make report` and commit it"
    readme = (ROOT / "README.md").read_text()
    block = readme.split(README_START, 1)[1].split(README_END, 1)[0]
    assert block.strip() == readme_block(results).strip(), "README's answers block is stale: run `make report`"


def test_every_committed_result_names_a_clean_commit_in_this_history_and_results_fit_their_budget():
    results = load_results(RESULTS)
    assert {s for r in results.values() for s in r["sections"]} == set(SECTIONS)
    for name, res in results.items():
        assert res["state"] in STATES, name
        if res.get("_artifact") is None:
            assert res["state"] in ("not-run", "unavailable") and res["reason"], name
            continue
        prov = res["provenance"]
        assert prov["clean_tree"] is True and commit_in_history(prov["code_commit"]), name
        if prov.get("simulator_commit"):
            assert commit_in_history(prov["simulator_commit"]), name
        assert prov["dataset_id"] and prov["runtime"]["python"], name
        assert res["raw_traces"] and all(len(t["sha256"]) == 64 for t in res["raw_traces"]) or \
            res["source_kind"] == "simulator", name
        import hashlib

        for rel, sha in res["files"].items():  # the published files are the ones result.json names
            assert hashlib.sha256((RESULTS / name / rel).read_bytes()).hexdigest() == sha, (name, rel)
    size = sum(p.stat().st_size for p in RESULTS.rglob("*") if p.is_file())
    assert size < 25e6, f"results/ is {size / 1e6:.1f} MB (budget 25 MB)"


def test_a_section_is_filled_by_a_run_result_over_a_placeholder_and_by_the_latest_version():
    from xdc.results_page import by_section

    def res(name: str, state: str, version: int | None) -> dict:
        prov = {"protocol": {"version": version}} if version is not None else {}
        return {"name": name, "state": state, "sections": ["controller"], "provenance": prov}

    got = by_section({"controller-heldout": res("controller-heldout", "unavailable", None),
                      "controller-heldout-v5": res("controller-heldout-v5", "no-claim", 5),
                      "controller-heldout-v6": res("controller-heldout-v6", "claim", 6)})
    assert got["controller"]["name"] == "controller-heldout-v6"
    got = by_section({"a": res("a", "not-run", None), "b": res("b", "invalid", 5)})
    assert got["controller"]["name"] == "b"
    got = by_section({"a": res("a", "no-claim", 5), "b": res("b", "claim", 5)})
    assert got["controller"]["name"] == "a"  # a tie keeps the first by name


def test_the_controller_timeline_draws_both_arms_settings_and_marks_and_their_commit_ledgers():
    from xdc.page_studies import _controller_ledgers, _controller_svg

    def run(arm: str, intervals: list, marks: list, n: int) -> dict:
        ledger = [{"round": r, "wall_ns": 10**9 * (r + 1), "epoch": 1, "mode": "local", "inner_steps_h": 8,
                   "compression": "int8" if arm == "adaptive-v2" else "none", "action": "keep", "members": ["a", "b"],
                   "useful_tokens": 6144 * (r + 1), "wan_payload_bytes": 1000, "heldout_nll": None} for r in range(n)]
        return {"arm": arm, "run_id": f"run-{arm}", "t0_wall_ns": 0, "intervals": intervals, "marks": marks,
                "commit_ledger": ledger}

    view = {"stratum": "bw-collapse-mild", "rule": "the first stratum ...", "runs": [
        run("adaptive-v2", [{"label": "local H=32", "start_s": 0, "end_s": 2, "first_round": 0, "last_round": 1,
                             "commits": 2},
                            {"label": "local H=8 int8", "start_s": 2, "end_s": 9, "first_round": 2, "last_round": 8,
                             "commits": 7}],
            [{"kind": "change", "t_s": 2.0, "text": "after round 1: ..."},
             {"kind": "fault", "t_s": 4.0, "text": "link_degrade a<->b"},
             {"kind": "abstain", "t_s": 5.0, "text": "after round 4: too few samples"}], 9),
        run("fixed-h8", [{"label": "local H=8", "start_s": 0, "end_s": 12, "first_round": 0, "last_round": 10,
                          "commits": 11}], [{"kind": "fault", "t_s": 4.1, "text": "link_degrade a<->b"}], 11)]}
    svg = _controller_svg(view)
    assert svg.count("<rect ") == 3 and "aria-label='Settings of adaptive-v2 and fixed-h8 on one time axis" in svg
    assert svg.count("fill='#c00'") == 1 and svg.count("<circle ") == 1 and svg.count("stroke-width='1.5'") == 2
    assert "Stratum <b>bw-collapse-mild</b>" in svg and "◆ setting changed" in svg
    led = _controller_ledgers(view)
    assert "adaptive-v2 (run-adaptive-v2): 9 commits" in led and "fixed-h8 (run-fixed-h8): 11 commits" in led
    assert led.count("<tr>") == 2 + 9 + 11 and "local H=8 int8" in led
    assert "No controller timeline: no stratum has both runs" in _controller_svg(
        {"stratum": None, "rule": "no stratum has both runs", "runs": []})


def test_every_answer_in_the_readme_is_one_table_row():
    """A claim written as a YAML folded block ends in a newline; the README's table row must not break."""
    block = readme_block(load_results(RESULTS))
    rows = block.strip().splitlines()
    answers = rows[2:]  # after the header and its rule
    assert len(answers) == len(SECTIONS)
    assert all(r.startswith("| [") and r.endswith(" |") for r in answers), [r for r in answers if not r.endswith(" |")]
