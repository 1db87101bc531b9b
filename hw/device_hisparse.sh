#!/usr/bin/env bash
# One device call for issue 26's HiSparse kernels: the GPU tests of the plain / planned-copy / MTP swap-in kernels,
# then `hw hisparse` (checks vs numpy + graph-replayed and eager timings at batch 1..256) -> $OUT/hisparse_swapin.json.
# Usage on the device machine (repo root): bash hw/device_hisparse.sh   (OUT defaults to out/device)
# hypothesis is carried as wheels in .whl/ when the image lacks it (the tests' conftest imports it; hw/device_env.sh
# says how to fetch them): name .whl in the device call's carry. Afterwards, here: copy $OUT/hisparse_swapin.json to hw/results/ and
#   python3 -c "from hw.calibrate import merge_hisparse; merge_hisparse('hw/calibration/h200.yaml', \
#     'hw/results/hisparse_swapin.json')"      # the HiSparse keys and provenance.hisparse only
set -uo pipefail
source hw/device_env.sh
LOG=$OUT/hisparse.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | tee -a "$LOG"
python3 -c "import cupy; print('cupy', cupy.__version__)" 2>&1 | tee -a "$LOG"
echo "=== tests $(date -u +%H:%M:%S)" | tee -a "$LOG"
timeout ${TEST_S:-150} python3 -m pytest -q -m gpu tests/test_hw_hisparse.py tests/test_hw_hisparse_mtp.py \
  -p no:cacheprovider 2>&1 | tee -a "$LOG" | tail -25
echo "=== hisparse $(date -u +%H:%M:%S)" | tee -a "$LOG"
timeout ${BENCH_S:-400} python3 -m hw hisparse --out "$OUT/hisparse_swapin.json" ${HS_ARGS:-} 2>&1 | tee -a "$LOG"
echo "=== done $(date -u +%H:%M:%S)" | tee -a "$LOG"
