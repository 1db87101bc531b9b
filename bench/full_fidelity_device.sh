#!/usr/bin/env bash
# One device call for issue 29: the equality tests (-m gpu: cupy-vs-numpy replays, device-drawn selections vs the
# host generator), the selection bench (bench/device_selections.py), then bench/full_fidelity.py on each config of
# $RUNS at full fidelity on the cupy policy backend: cut at $STEPS decode steps (default 0 = the whole run, stopped
# at $MAX_WALL_S with its progress ticks kept), each run's decode steps of its default-fidelity replay for the
# estimate. Writes $OUT/fidelity.log, $OUT/device_selections.json, $OUT/full_fidelity_<name>.json.
# simpy and hypothesis are carried as wheels in .whl/ (the image lacks them; hw/device_env.sh says how to fetch them).
# $BYGROUP names configs to run group by group with their ratios recorded and played back
# (bench/full_fidelity_by_group.py --ratios, $BYG_PROCESSES processes of one library thread each, stopped at $BYG_S):
# $OUT/full_fidelity_by_group_<name>.json and the ratio logs as one $OUT/ratios_<name>.tar (a call returns 8 files at
# most); a later call resumes from both where $SEED holds them (its .json and .tar, carried).
# Usage on the device machine (repo root): RUNS="h200-tp-specon:2146" bash bench/full_fidelity_device.sh
# (RUNS="": the tests and the selection bench alone; TESTS=0: the runs alone; TESTS=h200: the tests on an H200 only)
# BYG_END_S: the by-group step ends this many seconds after the script began (instead of $BYG_S of its own), so tests
# that ran first (an H200 came) do not push it past the call's limit before its finished logs are tarred.
set -uo pipefail
T0=$(date +%s)
source hw/device_env.sh
LOG=$OUT/fidelity.log
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$LOG"
if [ "${TESTS:-1}" = h200 ]; then   # the tests where they add something: on an H200
  nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && TESTS=1 || TESTS=0
fi
if [ "${TESTS:-1}" = 1 ]; then   # TESTS=0: the runs alone
  echo "=== tests $(date -u +%H:%M:%S)" | tee -a "$LOG"
  timeout ${TEST_S:-200} python3 -m pytest -q -m gpu tests/test_policy_backend_replay.py tests/test_device_selections.py \
    -p no:cacheprovider 2>&1 | tee -a "$LOG" | tail -15
  echo "=== selections $(date -u +%H:%M:%S)" | tee -a "$LOG"
  timeout 120 python3 bench/device_selections.py --out "$OUT/device_selections.json" 2>&1 | tee -a "$LOG" | tail -2
fi
for run in ${RUNS-h200-tp-specon:2146}; do   # name:decode steps of the default-fidelity replay
  name=${run%%:*} steps=${run##*:}
  echo "=== full fidelity $name $(date -u +%H:%M:%S)" | tee -a "$LOG"
  ref=bench/results/drain_reference_$name.json   # a stopped run's end from how its requests drain, where one exists
  timeout $(( ${MAX_WALL_S:-400} + 60 )) python3 bench/full_fidelity.py "configs/paper-$name.yaml" \
    --policy-backend "${BACKEND:-cupy}" --steps ${STEPS:-0} --full-run-steps "$steps" --max-wall-s ${MAX_WALL_S:-400} \
    $( [ -f "$ref" ] && echo --reference "$ref" ) \
    --max-memory-gb 120 --out "$OUT/full_fidelity_$name.json" 2>&1 | tee -a "$LOG" | tail -4
done
for name in ${BYGROUP-}; do
  echo "=== by group $name $(date -u +%H:%M:%S)" | tee -a "$LOG"
  json=$OUT/full_fidelity_by_group_$name.json ratios=/tmp/ratios_$name
  mkdir -p "$ratios"
  [ -f "${SEED:-.}/full_fidelity_by_group_$name.json" ] && cp "$SEED/full_fidelity_by_group_$name.json" "$json"
  [ -f "${SEED:-.}/ratios_$name.tar" ] && tar -xf "$SEED/ratios_$name.tar" -C "$ratios"
  byg_s=${BYG_S:-500}
  [ -n "${BYG_END_S:-}" ] && byg_s=$(( BYG_END_S - ($(date +%s) - T0) ))
  if [ "$byg_s" -lt 60 ]; then   # (timeout takes no negative limit; under a minute no group can finish)
    echo "by group $name skipped: ${byg_s} s left of BYG_END_S=${BYG_END_S:-}" | tee -a "$LOG"; continue
  fi
  used_kb() { awk '/MemTotal/{t=$2} /MemAvailable/{a=$2} END{print t-a}' /proc/meminfo; }
  echo "host memory in use before: $(used_kb) kB" | tee -a "$LOG"
  ( peak=0; while sleep 1; do u=$(used_kb); [ "$u" -gt "$peak" ] && peak=$u && echo "$peak" > /tmp/peak_kb; done ) &
  sampler=$!
  ULACACHE_THREADS=1 timeout $byg_s python3 bench/full_fidelity_by_group.py "configs/paper-$name.yaml" \
    --processes ${BYG_PROCESSES:-16} --ratios "$ratios" --out "$json" 2>&1 | tee -a "$LOG" | tail -25
  kill $sampler
  echo "=== end $(date -u +%H:%M:%S); host memory in use at its peak (sampled each second): $(cat /tmp/peak_kb) kB" \
    | tee -a "$LOG"
  outabs=$(cd "$OUT" && pwd)
  (cd "$ratios" && tar -cf "$outabs/ratios_$name.tar" -- *.npz)   # (finished logs only: no partial streams)
done
echo "=== done $(date -u +%H:%M:%S)" | tee -a "$LOG"
