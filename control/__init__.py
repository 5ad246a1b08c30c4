"""Consistency settings per epoch and the adaptive controller (issue 12).

setting.py       the typed setting (mode, H, compression), its wire form, the per-epoch schedule
                 arithmetic (steps, round sizes) and the effective config of an epoch
scripted.py      a scripted schedule of settings: which change is due at which round boundary
observations.py  what one finished communication cycle measured (a typed, logged event)
controller.py    the adaptive controller: a pure function of observations and the setting
(the site's side, entering a round in a setting, is site_agent/consistency.py)
"""
