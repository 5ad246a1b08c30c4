"""Print the requirements of pyproject.toml that this Python's environment does not satisfy, one a line.

Used by compose/Dockerfile: on the upstream python base every dependency is missing and gets
installed; on the local base of `make compose-setup` (the host venv's packages) nothing is, and the
image build needs no package index. A requirement counts as satisfied when its distribution is
installed at a version the specifier allows (checked with `packaging` when the environment has it,
else by presence only).
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata


def missing(requirements: list[str]) -> list[str]:
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pragma: no cover - the upstream slim base has no `packaging`
        Requirement = None  # type: ignore[assignment]
    out = []
    for req in requirements:
        name = re.split(r"[\s<>=!~\[;(]", req, maxsplit=1)[0]
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            out.append(req)
            continue
        if Requirement is not None and not Requirement(req).specifier.contains(version, prereleases=True):
            out.append(req)
    return out


def main(argv: list[str]) -> int:
    with open(argv[1], "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    for req in missing(deps):
        print(req)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
