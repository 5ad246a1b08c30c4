"""Ids, names and hashes read from the wire or a file match whole: `^...$` with `re.match` lets a trailing
newline through ("a" + "\\n" matched), so every such pattern is applied with `fullmatch` (issue 54)."""

from __future__ import annotations

import pytest

from checkpoint_store.blobstore import is_sha256_hex
from ground.messages import NAME, SHA256, BadMessage, get_str

H = "ab" * 32


@pytest.mark.parametrize("value", [H + "\n", "\n" + H, H[:-1] + "\n"])
def test_a_hash_with_a_newline_is_not_a_sha256(value):
    assert not is_sha256_hex(value)
    with pytest.raises(BadMessage, match="is not a sha256"):
        get_str("checkpoint_durable", {"manifest_hash": value}, "manifest_hash", pattern=SHA256, max_len=65,
                what="a sha256")


def test_a_site_name_with_a_trailing_newline_is_refused_and_a_plain_one_accepted():
    with pytest.raises(BadMessage, match="is not a site name"):
        get_str("peer_unreachable", {"peer": "b\n"}, "peer", pattern=NAME, what="a site name")
    assert get_str("peer_unreachable", {"peer": "b"}, "peer", pattern=NAME, what="a site name") == "b"
    assert is_sha256_hex(H)
