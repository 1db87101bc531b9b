#!/usr/bin/env bash
# One device call for issue 29: the cupy-vs-numpy replay equality tests (-m gpu), then bench/full_fidelity.py on
# configs/paper-h200-tp-specon.yaml at full fidelity, cut at a few decode steps, on the cupy policy backend (and on
# numpy over the host's cores, the same machine's baseline). Writes $OUT/fidelity.log, $OUT/full_fidelity_*.json.
# simpy and hypothesis are carried as wheels in .whl/ (the image lacks them; hw/device_env.sh says how to fetch them).
# Usage on the device machine (repo root): bash bench/full_fidelity_device.sh [STEPS...]   (default 2 4)
set -uo pipefail
source hw/device_env.sh
LOG=$OUT/fidelity.log
steps=${*:-2 4}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$LOG"
echo "=== tests $(date -u +%H:%M:%S)" | tee -a "$LOG"
timeout ${TEST_S:-150} python3 -m pytest -q -m gpu tests/test_policy_backend_replay.py -p no:cacheprovider 2>&1 \
  | tee -a "$LOG" | tail -15
for backend in ${BACKENDS-cupy numpy}; do   # BACKENDS= (empty): the tests only
  echo "=== full fidelity $backend $(date -u +%H:%M:%S)" | tee -a "$LOG"
  timeout ${CUT_S:-400} python3 bench/full_fidelity.py configs/paper-h200-tp-specon.yaml --policy-backend "$backend" \
    --steps $steps --full-run-steps 2146 --max-wall-s ${MAX_WALL_S:-200} --max-memory-gb 120 \
    --out "$OUT/full_fidelity_$backend.json" 2>&1 | tee -a "$LOG" | tail -4
done
echo "=== done $(date -u +%H:%M:%S)" | tee -a "$LOG"
