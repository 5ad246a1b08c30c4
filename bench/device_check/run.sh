#!/bin/bash
# The GPU check in one command (docs/guide.md "Energy telemetry"): a 16 s NVML probe (idle, then under a bf16
# matmul loop), a fault-free cluster run on CUDA, and the same with one outage under `elastic`.
# Results under $OUT (default /tmp/xdc-device-check): nvml_probe.json, run1.log, run2.log, runs.tgz.
# Where the host lacks some of xdc's wheels, put them in .whl/ (they are installed into /tmp/site);
# where toxiproxy-server is not on PATH or in .venv/bin, set XDC_TOXIPROXY.
set -x
OUT=${OUT:-/tmp/xdc-device-check}; mkdir -p "$OUT"
D=bench/device_check
nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,power.draw --format=csv
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
$PY -c "import torch, sys; print(sys.version, torch.__version__, torch.cuda.is_available())"
timeout 60 $PY $D/nvml_probe.py "$OUT/nvml_probe.json"
XDC=($PY -c 'import sys; from xdc.cli import main; sys.exit(main())')
timeout "${T1:-240}" "${XDC[@]}" run --runs-dir runs/gpu --config $D/run.json --set train.device=cuda \
  > "$OUT/run1.log" 2>&1; echo "run1 rc=$?"; tail -30 "$OUT/run1.log"
timeout "${T2:-150}" "${XDC[@]}" run --runs-dir runs/gpu-fault --config $D/run.json \
  --scenario scenarios/one-outage.yaml --set recovery.policy=elastic --set train.device=cuda \
  > "$OUT/run2.log" 2>&1; echo "run2 rc=$?"; tail -30 "$OUT/run2.log"
tar czf "$OUT/runs.tgz" --exclude="*/store/blobs" runs/gpu runs/gpu-fault
