"""The generated report in a real headless Chromium (Debian's `chromium`, driven by Playwright).

Opens report/index.html of the session's real four-policy comparison from disk (file://, no
network), finds every section and a non-empty chart in each, hovers a timeline mark and reads
its event id and nanosecond bounds, loads a raw trace on demand, and fails on any console
error. The screenshot is kept as a test artifact in test-artifacts/ (or $XDC_TEST_ARTIFACTS).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from analysis.analyze import analyze
from analysis.checkers import CHECKERS
from analysis.report import CHART_SECTIONS, SECTIONS

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("XDC_CHROMIUM", "/usr/bin/chromium")
# Chromium on a machine with no outside network: no background fetches, no sandbox as root.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def report(comparison, tmp_path_factory) -> Path:
    out_dir, _index = comparison
    return analyze([out_dir], tmp_path_factory.mktemp("report")).report_path


@pytest.fixture(scope="module")
def page(report):
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} not found: `make test` installs Debian's chromium (apt)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        pg = browser.new_page(viewport={"width": 1280, "height": 900})
        problems: list[str] = []
        pg.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        pg.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
        # Self-contained: nothing but the report's own files (and inline data) is ever requested.
        pg.on("request", lambda r: None if r.url.startswith(("file:", "data:", "blob:", "about:"))
              else problems.append(f"network request: {r.url}"))
        pg.goto(report.as_uri())
        pg.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 5")
        pg.problems = problems
        yield pg
        browser.close()


def test_report_has_every_section_with_a_non_empty_chart(page):
    for sec in SECTIONS:
        assert page.locator(f"section#{sec}").count() == 1, sec
        assert page.locator(f"section#{sec} h2").inner_text().strip(), sec
    for sec in CHART_SECTIONS:
        n = page.evaluate(f"() => document.querySelector('#chart-{sec}').data.length")
        # What was drawn: bars and markers are `.point` elements, lines `.js-line` paths.
        drawn = page.locator(f"#chart-{sec} .point, #chart-{sec} .js-line").count()
        assert n > 0 and drawn > 0, (sec, n, drawn)
        assert page.locator(f"#chart-{sec} .main-svg").first.is_visible(), sec
    assert page.locator("section#recovery h2").inner_text() == "The same failure, four ways to recover"
    assert page.locator("#timeline-list tbody tr").count() > 0  # the accessible list of the same events
    assert "unavailable" in page.locator("section#learning").inner_text()  # energy, with no counter read
    # The learning chart draws the count baselines of the evaluation set as labelled lines.
    names = page.evaluate("() => document.querySelector('#chart-learning').data.map(t => t.name)")
    assert {"unigram baseline", "bigram baseline", "kn5 baseline"} <= set(names), names
    assert page.locator("section#learning p.verdict").inner_text().strip()
    assert page.locator("section#checks td.pass").count() == len(CHECKERS)  # every checker, faults_fired included


def test_hovering_a_timeline_mark_shows_its_event_id_and_bounds(page):
    page.locator("section#recovery").scroll_into_view_if_needed()
    points = page.locator("#chart-recovery .scatterlayer .trace path.point")
    assert points.count() > 0
    shown = ""
    for i in range(min(points.count(), 8)):  # the first mark not covered by the legend or another mark
        box = points.nth(i).bounding_box()
        if box is None:
            continue
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        try:
            page.wait_for_selector("#chart-recovery .hoverlayer .hovertext", timeout=2000)
        except Exception:
            continue
        shown = page.locator("#chart-recovery .hoverlayer").text_content() or ""
        if "event" in shown:
            break
    assert re.search(r"event [a-z0-9_.-]+:\d+", shown), shown
    assert re.search(r"start_ns \d{18,}", shown) and re.search(r"end_ns \d{18,}", shown), shown


def test_raw_trace_loads_on_demand_from_disk(page):
    block = page.locator("section#provenance details").first
    block.locator("summary").click()
    block.locator("button").click()
    status = block.locator(".trace-status")
    page.wait_for_function("(el) => /events loaded/.test(el.textContent)", arg=status.element_handle(), timeout=20000)
    assert block.locator("tbody tr").count() > 0


def test_no_console_errors_no_network_and_a_screenshot_is_kept(page):
    out = Path(os.environ.get("XDC_TEST_ARTIFACTS", ROOT / "test-artifacts"))
    out.mkdir(parents=True, exist_ok=True)
    shot = out / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 50_000
    assert page.problems == [], page.problems
