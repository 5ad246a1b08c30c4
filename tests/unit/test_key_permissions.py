"""A run's CurveZMQ keys are the owner's alone: 0700 folders, 0600 secret keys, and a secret key that
group or others can read is refused with a message naming the file (issue 54: any local user could
otherwise take `coord.key_secret` and speak as the coordinator on its 127.0.0.1 port)."""

from __future__ import annotations

import stat

import pytest

from wan.keys import CurveKeyError, generate_cluster_keys, load_keypair


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
