"""ground/values.builder: a frozen dataclass value built by filling its __dict__ is the value its
constructor makes (equal, same hash and repr, same class); a class whose __init__ does more gets its
own constructor back."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from coordinator.core_types import Received
from ground.messages import Built, RoundDone
from ground.plans import EpochPlan, Restore
from ground.values import builder


def test_a_received_message_built_fast_is_the_constructed_one() -> None:
    build = builder(Received)
    assert build is not Received
    for args in [("a", 1, 2, "heartbeat", {"round": 3}), ("s0999", 7, 0, "round_done", Built(None, {}, None))]:
        fast, slow = build(*args), Received(*args)
        assert type(fast) is Received and fast == slow and repr(fast) == repr(slow)
        with pytest.raises(dataclasses.FrozenInstanceError):
            fast.src = "b"  # type: ignore[misc]
    assert hash(build("a", 1, 2, "heartbeat", None)) == hash(Received("a", 1, 2, "heartbeat", None))
    assert pickle.loads(pickle.dumps(build("a", 1, 2, "k", None))) == Received("a", 1, 2, "k", None)


def test_a_round_report_built_fast_is_the_constructed_one() -> None:
    args = (4, 40, "ab" * 32, 96, 192, 6144, 1.5e9, tuple(range(96, 104)))
    assert builder(RoundDone)(*args) == RoundDone(*args)
    assert hash(builder(RoundDone)(*args)) == hash(RoundDone(*args))


def test_the_wrong_number_of_fields_is_the_constructors_error() -> None:
    with pytest.raises(TypeError, match="missing"):
        builder(Received)("a", 1)
    with pytest.raises(TypeError):
        builder(Received)("a", 1, 2, "k", None, "extra")


@dataclasses.dataclass(frozen=True)
class _Checked:
    x: int

    def __post_init__(self) -> None:
        if self.x < 0:
            raise ValueError("negative")


@dataclasses.dataclass(frozen=True)
class _Defaulted:
    x: int
    y: int = 3


@dataclasses.dataclass(frozen=True, slots=True)
class _Slotted:
    x: int


@dataclasses.dataclass(frozen=True, init=False)
class _OwnInit:
    x: int

    def __init__(self, x: int) -> None:
        object.__setattr__(self, "x", abs(x))


@dataclasses.dataclass(frozen=True)
class _KeywordOnly:
    x: int
    y: int = dataclasses.field(kw_only=True)


@dataclasses.dataclass(frozen=True)
class _NamedLikeTheBuilder:
    _values_cls: int


@dataclasses.dataclass(frozen=True)
class _Plain:
    cls: int
    new: str
    obj: tuple[int, ...]


def test_fields_named_like_python_names_are_stored_as_given() -> None:
    assert builder(_Plain)(1, "n", (2,)) == _Plain(1, "n", (2,))


def test_a_class_with_defaults_is_built_from_every_field_and_never_defaults_one() -> None:
    build = builder(_Defaulted)
    assert build is not _Defaulted and build(1, 2) == _Defaulted(1, 2) and build(1, 3) == _Defaulted(1)
    with pytest.raises(TypeError, match="missing"):
        build(1)  # the constructor would default y: the builder never does


@pytest.mark.parametrize("cls", [_Checked, _Slotted, _OwnInit, _KeywordOnly, _NamedLikeTheBuilder, int])
def test_a_class_whose_init_does_more_than_store_keeps_its_constructor(cls: type) -> None:
    assert builder(cls) is cls


def test_a_plans_incarnation_is_the_first_it_names_for_the_site() -> None:
    plan = EpochPlan(epoch=1, members=("a", "b"), paused=False, start_round=0, start_cursor=0, restore=Restore.NONE,
                     incarnations=(("a", 2), ("b", 3), ("a", 9)))
    assert [plan.incarnation_of(s) for s in ("a", "b", "c")] == [2, 3, None]
    # The lookup table is not a field: the plan's equality, hash and body are as before.
    same = dataclasses.replace(plan)
    assert same == plan and hash(same) == hash(plan) and "_incarnation_by_site" not in plan.to_body()
