"""Scenario text with the line of every field: YAML from node marks, TOML best-effort (tomllib
keeps no positions). The validator names these lines in its errors; studies/protocol.py reads
protocols with the same YAML reader."""

from __future__ import annotations

import re
from typing import Any

from chaos.fields import FieldPath
from chaos.fields import dotted as _dotted
from chaos.fault_parts import ScenarioError


def _yaml_tree(text: str, source: str) -> tuple[Any, dict[FieldPath, int]]:
    """Parse YAML into plain values plus the 1-based line of every path (from node marks)."""
    import yaml

    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        raise ScenarioError(source, line, "", f"not valid YAML: {e.problem or e}") from None
    except yaml.YAMLError as e:
        raise ScenarioError(source, None, "", f"not valid YAML: {e}") from None
    lines: dict[FieldPath, int] = {}
    constructor = yaml.SafeLoader("")  # resolves plain scalars (ints, floats, bools, null)

    def walk(n: Any, path: FieldPath) -> Any:
        lines[path] = n.start_mark.line + 1
        if isinstance(n, yaml.MappingNode):
            constructor.flatten_mapping(n)  # merge keys (<<)
            out: dict[Any, Any] = {}
            for kn, vn in n.value:
                k = constructor.construct_object(kn, deep=True)
                if not isinstance(k, (str, int, float, bool)) or k is None:
                    raise ScenarioError(source, kn.start_mark.line + 1, _dotted(path), f"bad key {k!r}")
                if k in out:
                    raise ScenarioError(source, kn.start_mark.line + 1, _dotted((*path, k)), "duplicate key")
                out[k] = walk(vn, (*path, k))
                lines[(*path, k)] = kn.start_mark.line + 1  # the key's line (a block value starts below it)
            return out
        if isinstance(n, yaml.SequenceNode):
            return [walk(c, (*path, i)) for i, c in enumerate(n.value)]
        return constructor.construct_object(n, deep=True)

    if node is None:
        return {}, lines
    return walk(node, ()), lines


_TOML_HEADER = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\"' -]+?)\s*\]\]?\s*(#.*)?$")
_TOML_KEY = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*=")


def _toml_lines(text: str) -> dict[FieldPath, int]:
    """Best-effort line of each path of a scenario TOML (tomllib keeps no positions):
    top-level keys, each `[[faults]]` table, its keys, and `[faults.params]`/`[faults.heal]`
    sub-tables or inline tables."""
    lines: dict[FieldPath, int] = {(): 1}
    table: FieldPath = ()
    n_faults = -1
    for no, line in enumerate(text.splitlines(), 1):
        m = _TOML_HEADER.match(line)
        if m and line.lstrip().startswith("["):
            name = m.group(1).strip()
            if line.lstrip().startswith("[[") and name == "faults":
                n_faults += 1
                table = ("faults", n_faults)
            elif name.startswith("faults.") and n_faults >= 0:
                table = ("faults", n_faults, *name.split(".")[1:])
            else:
                table = tuple(name.split("."))
            lines.setdefault(table, no)
            continue
        m = _TOML_KEY.match(line)
        if m:
            lines.setdefault((*table, m.group(1)), no)
            # keys of an inline table on the same line: params = {latency_ms = 80}
            if "{" in line:
                for k in re.findall(r"[{,]\s*([A-Za-z0-9_-]+)\s*=", line):
                    lines.setdefault((*table, m.group(1), k), no)
    return lines
