"""A run's CurveZMQ keys are the owner's alone: 0700 folders, 0600 secret keys, and a secret key that
group or others can read is refused with a message naming the file (issue 54: any local user could
otherwise take `coord.key_secret` and speak as the coordinator on its 127.0.0.1 port)."""

from __future__ import annotations

import stat

import pytest

from wan.keys import (SECRET_KEYS_ENV, CurveKeyError, deal_secret_keys, generate_cluster_keys, load_keypair,
                      secret_key_path)


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_generated_keys_are_readable_by_their_owner_only(tmp_path):
    keys = tmp_path / "keys"
    generate_cluster_keys(keys, ["coord", "a"])
    assert [mode(d) for d in (keys, keys / "public", keys / "private")] == [0o700, 0o700, 0o700]
    secrets = sorted((keys / "private").glob("*.key_secret"))
    assert [p.name for p in secrets] == ["a.key_secret", "coord.key_secret"]
    assert all(mode(p) == 0o600 for p in secrets)
    assert load_keypair(keys, "coord").secret


def test_a_world_readable_secret_key_is_refused_naming_the_file(tmp_path):
    keys = tmp_path / "keys"
    generate_cluster_keys(keys, ["coord"])
    secret = keys / "private" / "coord.key_secret"
    secret.chmod(0o644)
    with pytest.raises(CurveKeyError, match=rf"refusing the secret key {secret}: its mode is 0644"):
        load_keypair(keys, "coord")
    generate_cluster_keys(keys, ["coord"])  # regenerating (idempotent) mends the mode of a key it keeps
    assert mode(secret) == 0o600 and load_keypair(keys, "coord").public


def test_dealt_keys_leave_the_run_directory_and_each_process_reads_its_own(tmp_path, monkeypatch):
    """Compose's `init` (`xdc prepare --secret-keys-out`): every secret key moves out of the run directory
    into a 0700 folder of its process's own (0600; by its place in the order), the folder whose volume
    compose mounts into that process's service alone; with XDC_SECRET_KEYS_DIR naming it, the process loads its key there."""
    keys, out = tmp_path / "run" / "keys", tmp_path / "vol"
    generate_cluster_keys(keys, ["coord", "a"])
    before = load_keypair(keys, "a")
    deal_secret_keys(keys, out, ["coord", "a"])
    assert list((keys / "private").glob("*")) == []  # nothing secret left in the shared run directory
    assert sorted(p.name for p in (keys / "public").glob("*.key")) == ["a.key", "coord.key"]
    for i, name in enumerate(("coord", "a")):
        assert mode(out / str(i)) == 0o700 and mode(out / str(i) / f"{name}.key_secret") == 0o600
        assert [p.name for p in (out / str(i)).iterdir()] == [f"{name}.key_secret"]  # its own key alone
    monkeypatch.setenv(SECRET_KEYS_ENV, str(out / "1"))
    assert secret_key_path(keys, "a") == out / "1" / "a.key_secret"
    assert load_keypair(keys, "a") == before
    with pytest.raises(CurveKeyError, match="no secret key for 'coord'"):
        load_keypair(keys, "coord")  # another process's key is not in this one's folder
