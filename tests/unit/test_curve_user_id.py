"""Under CURVE the sender of a ROUTER message is the owner of its key (the ZAP User-Id). A message that
arrives without a User-Id belongs to nobody: its routing id, which the connection chose itself, is never
taken instead (issue 54). Pure logic of wan/receiver.py with a stand-in frame."""

from __future__ import annotations

from types import SimpleNamespace

import zmq

from wan.receiver import NO_USER_ID, ROUTING_ID_SEP, ReceivingMixin


class Frame:
    def __init__(self, user: str | None, raises: bool = False) -> None:
        self.user, self.raises = user, raises

    def get(self, prop: str):
        assert prop == "User-Id"
        if self.raises:
            raise zmq.ZMQError(22)
        return self.user


def node(curve: bool) -> SimpleNamespace:
    return SimpleNamespace(wan=SimpleNamespace(curve=curve))


def test_a_curve_message_without_a_user_id_belongs_to_nobody_not_to_its_routing_id():
    peer = ReceivingMixin._router_peer
    assert peer(node(True), b"coord" + ROUTING_ID_SEP.encode() + b"17", Frame("b")) == "b"
    assert peer(node(True), b"coord" + ROUTING_ID_SEP.encode() + b"17", Frame(None)) == NO_USER_ID
    assert peer(node(True), b"coord" + ROUTING_ID_SEP.encode() + b"17", Frame(None, raises=True)) == NO_USER_ID
    assert peer(node(True), b"coord" + ROUTING_ID_SEP.encode() + b"17", None) == NO_USER_ID
    assert peer(node(False), b"coord" + ROUTING_ID_SEP.encode() + b"17", None) == "coord"  # without CURVE the routing id is all there is


def test_its_message_is_rejected_as_an_identity_mismatch_even_if_it_names_no_user_id_as_its_source():
    msg = SimpleNamespace(src=NO_USER_ID)
    why = ReceivingMixin._identity_error(node(True), msg, NO_USER_ID, NO_USER_ID.encode())
    assert why is not None and why.startswith("identity_mismatch: a CURVE connection without a User-Id")
