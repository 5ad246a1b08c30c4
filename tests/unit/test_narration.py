"""The human lines of a run (ground/narrate.py): what a compose service prints, what the live display shows."""

from __future__ import annotations

from ground.narrate import Narrator


def _ev(process: str, event: str, **fields: object) -> dict:
    return {"process": process, "event": event, **fields}


def test_a_commit_line_says_how_far_the_run_is_and_the_members_latest_loss() -> None:
    n = Narrator()
    assert n.line(_ev("coord", "coordinator_started", policy="elastic", expected_sites=["a", "b", "c"],
                      target_tokens=131072)) == \
        "coordinator started: policy elastic, expecting sites a, b, c, target 131,072 useful tokens"
    assert n.line(_ev("coord", "site_metrics", site="a", metrics={"loss": 2.5, "round": 0})) is None
    assert n.line(_ev("coord", "site_metrics", site="b", metrics={"loss": 2.7, "round": 0})) is None
    assert n.line(_ev("coord", "commit", round=0, members=["a", "b", "c"], useful_tokens=24576)) == \
        "round 0 committed by a, b, c: 24,576 of 131,072 useful tokens (19 %), train loss 2.600"
    # a site that is no longer a member does not count in the loss
    assert n.line(_ev("coord", "commit", round=1, members=["a"], useful_tokens=32768)).endswith("train loss 2.500")


def test_a_commit_before_any_loss_or_target_says_so() -> None:
    assert Narrator().line(_ev("coord", "commit", round=0, members=["a"], useful_tokens=8192)) == \
        "round 0 committed by a: 8,192 useful tokens, train loss -"


def test_membership_faults_and_the_end_in_words() -> None:
    n = Narrator()
    setting = {"mode": "local", "inner_steps_h": 32, "compression": "none"}
    assert n.line(_ev("coord", "membership_epoch", epoch=2, members=["a", "c"], paused=False, start_round=17,
                      restore="store", donor=None, setting=setting, reason="b failed")) == \
        "epoch 2 formed: members a, c, from round 17, local H=32, restore from store (b failed)"
    assert n.line(_ev("coord", "membership_epoch", epoch=3, paused=True, reason="waiting for b")) == \
        "epoch 3: paused (waiting for b)"
    assert n.line(_ev("coord", "site_failed", site="b", reason="connection closed")) == "site b failed: connection closed"
    assert n.line(_ev("chaos", "fault_injected", fault=0, kind="site_crash", target="b")) == \
        "chaos: fault 0 injected: site_crash on b"
    assert n.line(_ev("a", "eval", heldout_nll=2.0123, useful_tokens_trained=98304)) == \
        "site a: held-out NLL 2.012 after 98,304 useful tokens"
    assert n.line(_ev("coord", "run_complete", useful_tokens=131072, commits=6, tip="e1r5")) == \
        "run complete: 131,072 useful tokens in 6 commits (tip e1r5)"
    assert n.line(_ev("store", "checkpoint_durable", ckpt_id="e1r3", round=3, bytes=7151880)) == \
        "checkpoint e1r3 of round 3 durable in the store, 7.2 MB"
    # events nobody needs to read as they happen stay in the log only
    assert n.line(_ev("coord", "heartbeat_stats")) is None and n.line(_ev("a", "compute", round=3)) is None
