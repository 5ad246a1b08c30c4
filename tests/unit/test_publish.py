"""`xdc publish` refuses what cannot be trusted as published, and publishes the rest in the state it earned.

Unit tests on a hand-made study directory (the tiny protocol, registered in a scratch registry, an
artifact with two run records): no process is started. The commits are this repository's own, so
"a commit in the history" is checked against the real git history.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from studies.cli import refuse_dirty_registration
from studies.protocol import load_protocol
from studies.registry import REGISTRY, RegistrationError, protocol_hash, read_registry, register
from xdc.publish import PublishRefused, not_run, one_clean_commit, publish

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "studies" / "protocols" / "tiny.yaml"
HEAD = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                      check=True).stdout.strip()
FIRST = subprocess.run(["git", "-C", str(ROOT), "rev-list", "--max-parents=0", "HEAD"], capture_output=True, text=True,
                       check=True).stdout.split()[0]


def clean(commit: str = HEAD) -> dict:
    return {"commit": commit, "dirty": False, "evidence": "measured"}


def make_study(tmp: Path, *, status: str = "no_claim", revs: list[dict] | None = None) -> tuple[Path, Path]:
    """A finished study directory of the tiny protocol and a scratch registry that holds it."""
    p = load_protocol(PROTO)
    h = protocol_hash(p)
    reg = tmp / "registry.json"
    entry = register(p, str(PROTO), clean(), reg)
    src = tmp / "tiny-v1"
    src.mkdir()
    (src / "protocol.yaml").write_text(PROTO.read_text())
    (src / "study.json").write_text(json.dumps({"name": "tiny", "version": entry["version"], "sha256": h,
                                                "protocol_file": str(PROTO), "protocol_dir": str(PROTO.parent)}))
    revs = revs or [clean(), clean()]
    runs = [{"key": f"calm/{arm}", "stratum": "calm", "arm": arm, "split": "heldout", "control": False,
             "run_dir": str(tmp / "gone" / arm), "code_revision": rev, "metrics": {},
             "record": {"dataset_id": "d" * 16, "final_heldout_nll": 2.5, "useful_tokens": 36864},
             "hashes": {"logs_sha256": "0" * 64}} for arm, rev in zip(("elastic", "restart"), revs)]
    text = {"no_claim": "The claim is not stated: 1 of 3 gates passed as written.",
            "invalid": "No claim: 1 invalidator(s) fired (unclean_exit: calm/restart).",
            "claim": "All 3 gates passed: restart is noninferior."}[status]
    art = {"kind": "xdc-study/1", "study": {"name": "tiny", "version": entry["version"], "sha256": h, "complete": True,
                                             "n_runs_finished": 2, "n_runs_planned": 2},
           "conclusion": {"status": status, "text": text}, "runs": runs}
    (src / "artifact.json").write_text(json.dumps(art))
    return src, reg


def test_a_clean_study_is_published_with_its_provenance_and_the_registry_points_at_it(tmp_path):
    src, reg = make_study(tmp_path)
    res = publish(src, "tiny", tmp_path / "results", reg, regenerate="xdc study run studies/protocols/tiny.yaml")
    assert res["state"] == "no-claim" and res["sections"] == ["tiny"]
    prov = res["provenance"]
    assert prov["code_commit"] == HEAD and prov["clean_tree"] is True and prov["dataset_id"] == "d" * 16
    assert prov["protocol"]["sha256"] == protocol_hash(load_protocol(PROTO)) and prov["protocol"]["registration_clean"]
    saved = json.loads((tmp_path / "results" / "tiny" / "result.json").read_text())
    assert saved["state"] == "no-claim" and "artifact.json" in saved["files"]
    entry = read_registry(reg)["studies"]["tiny"][-1]
    published = [r for r in entry["results"] if r.get("published")]
    assert len(published) == 1 and published[0]["status"] == "no_claim" and published[0]["code_commit"] == HEAD
    assert not Path(published[0]["artifact_path"]).is_absolute() or str(tmp_path) in published[0]["artifact_path"]


def test_an_invalidated_study_is_published_as_invalid_not_refused(tmp_path):
    src, reg = make_study(tmp_path, status="invalid")
    assert publish(src, "tiny", tmp_path / "results", reg)["state"] == "invalid"


def test_a_run_from_a_dirty_tree_is_refused(tmp_path):
    src, reg = make_study(tmp_path, revs=[clean(), {**clean(), "dirty": True}])
    with pytest.raises(PublishRefused, match=r"dirty tree at run time: calm/restart"):
        publish(src, "tiny", tmp_path / "results", reg)
    assert not (tmp_path / "results" / "tiny").exists()


def test_runs_at_two_revisions_are_refused(tmp_path):
    src, reg = make_study(tmp_path, revs=[clean(HEAD), clean(FIRST)] if FIRST != HEAD else [clean(), clean("f" * 40)])
    with pytest.raises(PublishRefused, match="mixed code revisions"):
        publish(src, "tiny", tmp_path / "results", reg)


def test_a_commit_the_history_does_not_hold_is_refused():
    with pytest.raises(PublishRefused, match="not in this repository's history"):
        one_clean_commit([("a", clean("1234567" * 5 + "89abc"))])


def test_a_tampered_protocol_is_refused(tmp_path):
    src, reg = make_study(tmp_path)
    text = (src / "protocol.yaml").read_text()
    (src / "protocol.yaml").write_text(text.replace("margin: 0.05,\n     alpha: 0.25", "margin: 0.5,\n     alpha: 0.25", 1))
    assert (src / "protocol.yaml").read_text() != text
    with pytest.raises(PublishRefused, match="protocol hash mismatch"):
        publish(src, "tiny", tmp_path / "results", reg)


def test_a_registry_entry_that_disagrees_is_refused(tmp_path):
    import hashlib

    src, reg = make_study(tmp_path)
    data = read_registry(reg)
    sha = hashlib.sha256((src / "artifact.json").read_bytes()).hexdigest()
    data["studies"]["tiny"][-1]["results"] = [{"artifact_path": "elsewhere", "artifact_sha256": sha,
                                               "status": "claim", "conclusion": "All gates passed."}]
    reg.write_text(json.dumps(data))
    with pytest.raises(PublishRefused, match="registry entry disagrees"):
        publish(src, "tiny", tmp_path / "results", reg)


def test_an_unregistered_protocol_is_refused(tmp_path):
    src, reg = make_study(tmp_path)
    reg.write_text(json.dumps({"kind": "xdc-study-registry/1", "studies": {}}))
    with pytest.raises(PublishRefused, match="not registered"):
        publish(src, "tiny", tmp_path / "results", reg)


def test_a_source_without_an_artifact_is_refused(tmp_path):
    with pytest.raises(PublishRefused, match="no artifact.json"):
        publish(tmp_path, "x", tmp_path / "results")


def test_a_section_without_a_result_needs_a_reason_and_a_known_section(tmp_path):
    with pytest.raises(PublishRefused, match="why"):
        not_run("x", "controller", "not-run", " ", "make studies", tmp_path)
    with pytest.raises(PublishRefused, match="unknown section"):
        not_run("x", "energy", "not-run", "no GPU", "", tmp_path)
    res = not_run("x", "energy-meter", "not-run", "the full-size study needs a GPU", "make study-cadence", tmp_path)
    assert json.loads((tmp_path / "x" / "result.json").read_text()) == res


def test_the_committed_registry_refuses_a_registration_from_a_dirty_tree(tmp_path):
    with pytest.raises(RegistrationError, match="dirty tree"):
        refuse_dirty_registration({"commit": HEAD, "dirty": True}, REGISTRY)
    with pytest.raises(RegistrationError, match="dirty tree"):
        refuse_dirty_registration({"commit": None, "dirty": None, "reason": "no git"}, REGISTRY)
    refuse_dirty_registration(clean(), REGISTRY)  # a clean tree registers
    refuse_dirty_registration({"commit": HEAD, "dirty": True}, tmp_path / "scratch.json")  # a scratch registry records it
