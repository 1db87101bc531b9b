#!/usr/bin/env bash
# One device call for issue 26's HiSparse kernels: the GPU tests of the plain / planned-copy / MTP swap-in kernels,
# then `hw hisparse` (checks vs numpy + graph-replayed and eager timings at batch 1..256) -> $OUT/hisparse_swapin.json.
# Usage on the device machine (repo root): bash hw/device_hisparse.sh   (OUT defaults to out/device)
# hypothesis is carried as wheels in .whl/ when the image lacks it (the tests' conftest imports it).
set -uo pipefail
OUT=${OUT:-out/device}
mkdir -p "$OUT"
LOG=$OUT/hisparse.log
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
if ! python3 -c "import hypothesis" 2>/dev/null && [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | tee -a "$LOG"
python3 -c "import cupy; print('cupy', cupy.__version__)" 2>&1 | tee -a "$LOG"
echo "=== tests $(date -u +%H:%M:%S)" | tee -a "$LOG"
timeout 240 python3 -m pytest -q -m gpu tests/test_hw_hisparse.py tests/test_hw_hisparse_mtp.py \
  -p no:cacheprovider 2>&1 | tee -a "$LOG" | tail -25
echo "=== hisparse $(date -u +%H:%M:%S)" | tee -a "$LOG"
timeout 420 python3 -m hw hisparse --out "$OUT/hisparse_swapin.json" ${HS_ARGS:-} 2>&1 | tee -a "$LOG"
echo "=== done $(date -u +%H:%M:%S)" | tee -a "$LOG"
