"""The byte ledger counts every byte once, by its sender, and a killed sender's last bytes by its receivers."""

from __future__ import annotations

from analysis.ledgers import byte_ledger


def _counters(proc: str, pid: int, rows: list[tuple[str, str, str, str, int]], final: bool) -> dict:
    return {"event": "wan_counters", "process": proc, "pid": pid, "final": final or None,
            "counters": [{"side": s, "link": l, "direction": d, "cls": c, "bytes": b, "messages": 1}
                         for s, l, d, c, b in rows]}


def test_a_killed_senders_unlogged_bytes_come_from_its_receivers_counters() -> None:
    # c's first incarnation (pid 1) was SIGKILLed after logging 100 B to a; a received 150 B from it.
    logs = {
        "c": [_counters("c", 1, [("tx", "c_to_a", "up", "collective", 100)], final=False),
              _counters("c", 2, [("tx", "c_to_a", "up", "collective", 40)], final=True)],
        "a": [_counters("a", 7, [("rx", "c_to_a", "up", "collective", 190),
                                 ("tx", "c_to_a", "down", "control", 10)], final=True)],
    }
    led = byte_ledger(logs, set())
    assert led["by_link_class"]["c_to_a"] == {"collective": 190, "control": 10}
    assert led["rx_filled"] == {"c_to_a": 50} and led["killed_senders"] == ["c"]


def test_senders_that_ended_cleanly_are_counted_by_themselves_alone() -> None:
    # Both ended with final counters: the receiver's count is never added or substituted.
    logs = {
        "c": [_counters("c", 1, [("tx", "c_to_a", "up", "collective", 100)], final=True)],
        "a": [_counters("a", 7, [("rx", "c_to_a", "up", "collective", 90)], final=True)],
    }
    led = byte_ledger(logs, set())
    assert led["by_link"] == {"c_to_a": 100} and led["rx_filled"] == {} and led["killed_senders"] == []


def test_a_killed_sender_whose_receivers_got_less_keeps_its_own_count() -> None:
    logs = {
        "c": [_counters("c", 1, [("tx", "c_to_a", "up", "collective", 100)], final=False)],
        "a": [_counters("a", 7, [("rx", "c_to_a", "up", "collective", 60)], final=True)],
    }
    led = byte_ledger(logs, set())
    assert led["by_link"] == {"c_to_a": 100} and led["rx_filled"] == {}
