"""The published page in a real headless Chromium (Debian's `chromium`, driven by Playwright).

Builds results/site/index.html from the committed results (as `make report` does) into a copy of
results/, opens it from disk (file://, no network), and checks what a reader meets: all seven
sections in the seed's order, each with a known data-state and an opening sentence that states its
answer or why there is none, accessible tables (a caption and column headers), a raw trace loaded
on demand, and no console error or network request. The screenshot is kept in test-artifacts/.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from xdc.publish import SECTIONS, STATES
from xdc.results_page import build

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("XDC_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    from playwright.sync_api import sync_playwright

    results = tmp_path_factory.mktemp("published") / "results"
    shutil.copytree(ROOT / "results", results)
    shutil.rmtree(results / "site")
    path = build(results)
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} not found: `make test` installs Debian's chromium (apt)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        pg = browser.new_page(viewport={"width": 1280, "height": 900})
        problems: list[str] = []
        pg.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        pg.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
        pg.on("request", lambda r: None if r.url.startswith(("file:", "data:", "about:"))
              else problems.append(f"network request: {r.url}"))
        pg.goto(path.as_uri())
        pg.problems = problems
        yield pg
        browser.close()


def test_every_section_states_its_answer_in_the_seed_order(page):
    got = page.evaluate("() => [...document.querySelectorAll('section[data-section]')].map(s => "
                        "[s.dataset.section, s.dataset.state, s.querySelector('p.state-sentence').innerText])")
    assert [s for s, _, _ in got] == list(SECTIONS)
    for section, state, sentence in got:
        assert state in STATES, (section, state)
        words = sentence.strip()
        assert len(words) > 30 and not any(w in words.lower() for w in ("loading", "spinner")), (section, words)
        # The badge and the sentence's first words name the state ("No claim: ...", "Not run: ...").
        assert state.replace("-", " ") in words.lower().replace("-", " ")[:40], (section, state, words)
    # The navigation at the top says the same answers, with links into the page.
    assert page.locator("nav li a").count() == len(SECTIONS)


def test_tables_are_accessible(page):
    tables = page.locator("table")
    assert tables.count() > 10
    missing = page.evaluate("() => [...document.querySelectorAll('table')].filter(t => !t.caption || "
                            "!t.querySelector('thead th[scope=col]')).length")
    assert missing == 0


def test_sections_with_a_result_carry_their_provenance_and_evidence_classes(page):
    for section in ("recovery", "learning", "equal-work", "simulator"):
        sec = page.locator(f"section#{section}")
        if sec.get_attribute("data-state") in ("not-run", "unavailable"):
            continue
        text = sec.inner_text()
        assert "measured" in text or "modeled" in text, section
        sec.locator("details.provenance summary").first.click()
        assert "code commit" in sec.locator("details.provenance").first.inner_text(), section


def test_a_raw_trace_loads_on_demand_from_disk(page):
    box = page.locator("section#recovery div.trace").first
    box.locator("button").click()
    status = box.locator(".trace-status")
    page.wait_for_function("(el) => /events loaded/.test(el.textContent)", arg=status.element_handle(), timeout=20000)
    assert box.locator("tbody tr").count() > 0


def test_no_console_errors_no_network_and_a_screenshot_is_kept(page):
    out = Path(os.environ.get("XDC_TEST_ARTIFACTS", ROOT / "test-artifacts"))
    out.mkdir(parents=True, exist_ok=True)
    shot = out / "published-report.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 50_000
    assert page.problems == [], page.problems
