"""The published page's sections, read from its HTML, for tests/unit/test_results_page.py and
tests/live/test_results_page.py."""

from __future__ import annotations

import re


def sections_of(html: str) -> list[tuple[str, str, str]]:
    """(data-section, data-state, opening sentence) of every section, in page order."""
    out = []
    for m in re.finditer(r"<section id='[^']+' data-section='([^']+)' data-state='([^']+)'><h2>.*?</h2>"
                         r"<p class='answer state-sentence'>(.*?)</p>", html, re.S):
        out.append((m.group(1), m.group(2), re.sub(r"<[^>]+>", "", m.group(3)).strip()))
    return out
