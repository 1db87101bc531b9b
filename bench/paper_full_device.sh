#!/usr/bin/env bash
# Paper scale at full fidelity (every indexer group, every request) on a many-core host's CPU, with the policy's
# groups split over N processes (sim/group_workers.py): replays cut at 2 and at 6 decode steps, so the difference
# gives the time of a decode step (admission and the first, probed step are in both). Writes $OUT/pfull_<N>_<steps>/.
# Usage (from the repository root, simpy importable): bash bench/paper_full_device.sh N [STEPS...]
set -u
n=${1:?processes}; shift
list=${*:-2 6}
for steps in $list; do
  d="$OUT/pfull_${n}_${steps}"
  /usr/bin/time -f "steps=$steps processes=$n wall_s=%e user_s=%U sys_s=%S maxrss_kb=%M" \
    python3 -m ulacache_cli replay configs/paper-h200-tp-specon.yaml --set fidelity.policy_groups=0 \
    --set fidelity.request_fraction=1.0 --set workload.max_steps="$steps" --max-memory-gb 120 \
    --policy-workers "$n" --out "$d" --quiet 2>&1 | tee "$OUT/time_${n}_${steps}.txt"
  rm -f "$d/timeline.parquet" "$d/config.yaml"
done
