"""`code_revision(ignoring=...)`: a registration's own registry file does not make the tree dirty, so several
protocols can be registered at one commit before the registry is committed; any other change still does.
A real git repository in a scratch folder."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ground.provenance import code_revision


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_changes_to_the_ignored_registry_leave_the_tree_clean_and_others_do_not(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "registry.json").write_text("{}\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "init")
    (tmp_path / "studies" / "registry.json").write_text('{"studies": {}}\n')
    assert code_revision(tmp_path)["dirty"] is True
    assert code_revision(tmp_path, ignoring=("studies/registry.json",))["dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    assert code_revision(tmp_path, ignoring=("studies/registry.json",))["dirty"] is True
