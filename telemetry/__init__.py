"""Telemetry: the energy/utilisation sampler and the rules that say when its meter can be trusted.

sensors.py   the one small sensor interface, RAPL, the modeled CPU meter, the clock
nvml.py      NVIDIA sensors through an injected `pynvml` module (nvidia-ml-py)
trace.py     the raw point trace (JSON lines) and its reader
validity.py  poll calibration, effective update periods, counter updates per phase, invalidators
sampler.py   the sampler process (`python -m telemetry.sampler`, `xdc sampler`)
launch.py    the launcher's hook: start it first, stop it last

Nothing here imports `analysis/` (analysis imports telemetry, never the reverse).
"""
