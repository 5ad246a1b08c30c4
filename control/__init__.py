"""Consistency settings per epoch and the adaptive controller (issue 12).

setting.py       the typed setting (mode, H, compression), its wire form, the per-epoch schedule
                 arithmetic (steps, round sizes) and the effective config of an epoch
scripted.py      a scripted schedule of settings: which change is due at which round boundary
observations.py  what one finished communication cycle measured (a typed, logged event)
controller.py    the adaptive controller's first rule (`comm_fraction`): keep the collective's share of a round
                 in a band; a pure function of observations and the setting
progress_rate.py controller v2 (`progress_rate`): the setting with the most predicted learning per second,
                 after each cycle and inside one (a round far over its prediction)
replay.py        a run's logged decisions replayed from its logged observations (exactly, or named)
(the site's side, entering a round in a setting, is site_agent/consistency.py)
"""
