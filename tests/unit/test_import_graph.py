"""The code's own imports, measured: no circle of modules (an import at module level, in a function
or anywhere but under `if TYPE_CHECKING:` counts), and the packages under contract are exactly the
ones pyproject's import-linter layers name. The layers themselves are `lint-imports` (make test)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]


def _packages() -> list[str]:
    return list(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"])


def circles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root) & modules)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w) & modules))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_circle_of_modules_in_the_packages_under_contract():
    sys.path.insert(0, str(ROOT))
    pkgs = _packages()
    graph = grimp.build_graph(*pkgs, exclude_type_checking_imports=True)
    modules = {m for m in graph.modules if m.split(".")[0] in pkgs}
    assert len(modules) > 100
    assert circles(graph, modules) == []


# Circles that exist only through annotations (`if TYPE_CHECKING:` imports: a helper module names the
# type of the object that calls it). No new one may appear, and one that is broken leaves this list;
# this is what issue 53 has left.
TYPE_ONLY_CIRCLES = [
    ["sim.coord", "sim.faults", "sim.gates", "sim.progress", "sim.rounds", "sim.services", "sim.site", "sim.world"],
]


def test_no_new_circle_through_annotations():
    sys.path.insert(0, str(ROOT))
    pkgs = _packages()
    graph = grimp.build_graph(*pkgs)
    modules = {m for m in graph.modules if m.split(".")[0] in pkgs}
    assert sorted(circles(graph, modules)) == sorted(TYPE_ONLY_CIRCLES)


def test_every_package_of_the_repository_is_under_contract():
    on_disk = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    assert set(_packages()) == on_disk


def test_the_circle_finder_finds_a_circle():
    class Graph:
        edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}

        def find_modules_directly_imported_by(self, m: str) -> set[str]:
            return set(self.edges.get(m, ()))

    assert circles(Graph(), {"a", "b", "c", "d"}) == [["a", "b", "c"]]  # type: ignore[arg-type]
