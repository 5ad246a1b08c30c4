"""A discrete-event simulator of N sites on a virtual clock that drives the emulator's own rules.

The coordinator's decisions come from the pure core (coordinator/core.py), the adaptive
controller's through it (control/controller.py via coordinator/settings.py), the scenario from
chaos/scenario.py, the config from ground/config.py. What the emulator measures, the simulator
models (sim/model.py, every parameter with its evidence class); the run directory it writes has
the emulator's layout and event records, so `xdc analyze` reads it (every number `modeled`).
"""
