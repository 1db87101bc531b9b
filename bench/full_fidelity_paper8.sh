#!/usr/bin/env bash
# One device call for issue 29's "also the 8 paper configs": bench/full_fidelity.py on each configs/paper-*.yaml at
# full fidelity, cut at 1 and 3 decode steps (each cut a fresh process), on the policy backend $BACKEND (default
# cupy, in group workers: one per usable core), with the whole run's decode steps of each config's default-fidelity
# replay (`ulacache replay configs/paper-<name>.yaml`, seed as committed; measured 2026-12-07 on the 2-core box) for
# the estimate. Writes $OUT/full_fidelity_paper8_<name>.json and $OUT/paper8.log. simpy and hypothesis as wheels in
# .whl/ (hw/device_env.sh); carry .whl. Usage (repo root): bash bench/full_fidelity_paper8.sh
set -uo pipefail
source hw/device_env.sh
LOG=$OUT/paper8.log
# name:decode steps of the default-fidelity replay
RUNS=${RUNS:-"h200-tp-specon:2146 h200-tp-specoff:6000 h200-dp-specon:2008 h200-dp-specoff:6000 b300-tp-specon:2370
b300-tp-specoff:7061 b300-dp-specon:2370 b300-dp-specoff:7061"}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$LOG"
for run in $RUNS; do
  name=${run%%:*} steps=${run##*:}
  echo "=== $name $(date -u +%H:%M:%S)" | tee -a "$LOG"
  timeout ${CONFIG_S:-90} python3 bench/full_fidelity.py "configs/paper-$name.yaml" --policy-backend "${BACKEND:-cupy}" \
    --steps ${CUTS:-1 3} --full-run-steps "$steps" --max-wall-s ${MAX_WALL_S:-80} --max-memory-gb ${MAX_GB:-110} \
    --out "$OUT/full_fidelity_paper8_$name.json" 2>&1 | tee -a "$LOG" | tail -1
done
echo "=== done $(date -u +%H:%M:%S)" | tee -a "$LOG"
