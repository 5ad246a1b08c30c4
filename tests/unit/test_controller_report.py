"""The report's controller section (analysis/controller_report.py) on a synthetic artifact: setting
intervals, marks that never rely on colour, the decisions table and the no-controller case."""

from __future__ import annotations

from analysis.controller_report import (MARKS, chosen_run, controller_section_html, marks, setting_intervals,
                                        setting_label)

T0 = 1_000_000_000_000


def _row(rnd: int, t_s: float, h: int, comp: str = "none", action: str = "keep", reason: str = "fine",
         members: tuple[str, ...] = ("a", "b", "c"), source: str = "adaptive") -> dict:
    return {"commit_id": f"c{rnd}", "parent": f"c{rnd - 1}" if rnd else None, "in_lineage": True,
            "wall_ns": T0 + int(t_s * 1e9), "epoch": 1, "round": rnd, "step": rnd * h, "mode": "local",
            "inner_steps_h": h, "compression": comp, "setting_source": source, "action": action,
            "action_reason": reason, "abstained": action == "abstain", "members": list(members),
            "membership_changed": False, "stress": [], "update_age_steps": h, "cos_to_mean": 0.5,
            "norm_ratio": 1.1, "useful_tokens": 1000 * (rnd + 1), "attempted_tokens": 1000, "replayed_tokens": 0,
            "wan_payload_bytes": 4096, "wan_time_s": 0.1, "goodput_bps": 1e6, "heldout_nll": None,
            "evidence": "measured"}


def _art(source: str = "adaptive") -> dict:
    ledger = [_row(0, 1.0, 4, source=source), _row(1, 2.0, 4, action="abstain", reason="link in flux", source=source),
              _row(2, 3.0, 4, action="change", reason="comm 0.9 of compute > 0.25", source=source),
              _row(3, 6.0, 16, members=("a", "c"), source=source), _row(4, 9.0, 16, "int8", members=("a", "c"), source=source),
              _row(5, 10.0, 16, "int8", members=("a", "b", "c"), source=source)]
    fixed = [dict(r, setting_source="fixed", action=None) for r in ledger[:2]]
    return {"runs": [{"run_id": "fixed-run", "policy": "elastic", "t0_wall_ns": T0, "faults": [], "commit_ledger": fixed},
                     {"run_id": "adaptive-run", "policy": "elastic", "t0_wall_ns": T0,
                      "faults": [{"kind": "link_degrade", "target": "a<->b", "t_s": 1.5}], "commit_ledger": ledger}]}


def test_the_section_is_about_the_adaptive_run_and_its_setting_intervals():
    art = _art()
    run = chosen_run(art)
    assert run["run_id"] == "adaptive-run"
    ivs = setting_intervals(run)
    assert [(iv["label"], iv["start_s"], iv["end_s"], iv["first_round"], iv["last_round"]) for iv in ivs] == [
        ("local H=4", 0.0, 3.0, 0, 2), ("local H=16", 3.0, 6.0, 3, 3), ("local H=16 int8", 6.0, 10.0, 4, 5)]
    assert setting_label({"mode": "sync", "inner_steps_h": 1, "compression": "none"}) == "sync"


def test_marks_name_faults_membership_abstentions_and_changes_in_time_order():
    ms = marks(chosen_run(_art()))
    assert [(m["kind"], m["t_s"]) for m in ms] == [("fault", 1.5), ("abstain", 2.0), ("change", 3.0), ("shrink", 6.0),
                                                   ("rejoin", 10.0)]
    assert len({sym for sym, _ in MARKS.values()}) == len(MARKS)  # a distinct shape per kind, not colour alone


def test_the_section_lists_each_decision_with_its_reason():
    html = controller_section_html(_art())
    assert "data-controller='adaptive'" in html and "chart-controller" in html
    assert "2 decisions changed the setting or abstained; 4 kept it" in html
    assert "link in flux" in html and "comm 0.9 of compute &gt; 0.25" in html
    assert "Optimizer-commit ledger of adaptive-run: 6 commits" in html


def test_a_report_without_a_controller_says_so():
    art = _art()
    art["runs"] = art["runs"][:1]
    html = controller_section_html(art)
    assert "data-controller='none'" in html and "no controller to show" in html
    assert "chart-controller" not in html
    assert "Optimizer-commit ledger of fixed-run: 2 commits" in html
