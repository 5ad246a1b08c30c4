"""A scripted schedule of settings (train.mode = scripted): which setting a round starts in.

The schedule is a list of changes, each (at_round | at_useful_tokens, setting). The setting of a
round that starts at round boundary (R, C) (round R, sample cursor C) is that of the last change
whose trigger that boundary has reached (at_round <= R, or at_useful_tokens <= C x seq_len), the
changes applying in list order (a later change waits until every earlier one applies); the
run's base setting when none has. This is a function of the boundary alone, not of history, so
a recovery epoch that replans rounds (a rollback, a failure in the round that switches) gets the
setting its start boundary has, and a change superseded by such an epoch is re-announced.
"""

from __future__ import annotations

from ground.setting import ConsistencySetting, SettingError, base_setting
from ground.config import RunConfig, ScheduledSetting


def _setting(e: ScheduledSetting) -> ConsistencySetting:
    return ConsistencySetting(e.mode, e.inner_steps_h, e.compression)


def check_schedule(cfg: RunConfig) -> None:
    """SettingError when a scripted schedule is malformed: each change has exactly one trigger, and
    triggers of the same kind do not go backwards."""
    last = {"at_round": -1, "at_useful_tokens": -1}
    for i, e in enumerate(cfg.train.settings_schedule):
        where = f"train.settings_schedule[{i}]"
        if (e.at_round >= 0) == (e.at_useful_tokens >= 0):
            raise SettingError(f"{where}: set exactly one of at_round, at_useful_tokens (>= 0)")
        _setting(e)
        key = "at_round" if e.at_round >= 0 else "at_useful_tokens"
        val = getattr(e, key)
        if val < last[key]:
            raise SettingError(f"{where}: {key} {val} is before the previous change's {last[key]}")
        last[key] = val
    if cfg.train.mode == "scripted" and not cfg.train.settings_schedule:
        raise SettingError("train.mode = scripted needs train.settings_schedule")


def setting_at(cfg: RunConfig, start_round: int, start_cursor: int) -> tuple[ConsistencySetting, int | None]:
    """The setting of a round starting at (start_round, start_cursor), and the index of the change
    that set it (None: the base setting)."""
    seq = cfg.model.seq_len
    cur, idx = base_setting(cfg), None
    for i, e in enumerate(cfg.train.settings_schedule):
        if not ((e.at_round >= 0 and start_round >= e.at_round) or
                (e.at_useful_tokens >= 0 and start_cursor * seq >= e.at_useful_tokens)):
            break  # changes apply in list order: a later one waits for this one
        cur, idx = _setting(e), i
    return cur, idx


def planned_rounds(cfg: RunConfig, n_members: int, target: int) -> list[tuple[int, int, int, ConsistencySetting]]:
    """The fault-free run's rounds under the scripted schedule: (round, cursor_start, cursor_end,
    setting) for every round until the target (in samples). What a single-process reference
    replays, and what the coordinator's switches produce when nothing fails."""
    out: list[tuple[int, int, int, ConsistencySetting]] = []
    rnd, cursor = 0, 0
    while cursor < target:
        s, _ = setting_at(cfg, rnd, cursor)
        # ground.schedule.samples_per_round under the epoch's setting (members x batch x H)
        end = min(cursor + n_members * cfg.train.per_site_batch * s.steps_per_round, target)
        out.append((rnd, cursor, end, s))
        rnd, cursor = rnd + 1, end
    return out
