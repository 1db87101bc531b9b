#!/usr/bin/env bash
# One device call: GPU tests, then the requested hw commands; one log plus the JSON/YAML results under $OUT
# (default ./out/device; at most 8 files come back from the device tool).
# Usage on the device machine: bash hw/device_run.sh "tests bench calibrate validate"
set -uo pipefail
OUT=${OUT:-out/device}
mkdir -p "$OUT"
LOG=${LOG:-$OUT/run.log}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD:${PYTHONPATH:-}
for step in ${1:-tests bench}; do
  echo "=== $step $(date -u +%H:%M:%S)" | tee -a "$LOG"
  case $step in
    tests) timeout 240 python3 -m pytest -q -x -m gpu tests/test_backend_parity.py tests/test_hw_gpu.py \
             -p no:cacheprovider >>"$LOG" 2>&1; tail -3 "$LOG" ;;
    bench) timeout 300 python3 -m hw bench --out "$OUT/bench.json" 2>&1 | tee -a "$LOG" ;;
    calibrate) timeout 300 python3 -m hw calibrate --out "$OUT/h200.yaml" --json "$OUT/calibration.json" 2>&1 \
             | tee -a "$LOG" ;;
    validate)  # one GPU alone: the single-GPU calibration; both GPUs busy (DP-2, TP-2): the node calibration
      cal1="$OUT/h200_single_gpu.yaml"; [ -f "$cal1" ] || cal1="$OUT/h200.yaml"
      timeout 200 python3 -m hw validate synthetic --ranks 1 --calibration "$cal1" --out "$OUT/validate_dp1.json" \
        ${VALIDATE_ARGS:-} 2>&1 | tee -a "$LOG"
      for mode in dp tp; do
        timeout 200 python3 -m hw validate synthetic --ranks 2 --mode $mode --calibration "$OUT/h200.yaml" \
          --out "$OUT/validate_${mode}2.json" ${VALIDATE_ARGS:-} 2>&1 | tee -a "$LOG"
      done ;;
    validate_trace)  # the multi-lexsum profile trace (64 requests, histories capped at 32K)
      python3 -m ulacache_cli trace gen --profile multi-lexsum --num-requests 64 --seed 1 --out /tmp/tr --force \
        >>"$LOG" 2>&1
      timeout 200 python3 -m hw validate /tmp/tr --ranks 1 --steps 30 --requests 64 --history 32768 \
        --gpu-slots 393216 --calibration "$OUT/h200_single_gpu.yaml" --out "$OUT/validate_trace_dp1.json" 2>&1 \
        | tee -a "$LOG"
      timeout 200 python3 -m hw validate /tmp/tr --ranks 2 --mode tp --steps 30 --requests 64 --history 32768 \
        --gpu-slots 262144 --calibration "$OUT/h200.yaml" --out "$OUT/validate_trace_tp2.json" 2>&1 | tee -a "$LOG" ;;
  esac
done
echo "=== done $(date -u +%H:%M:%S)" | tee -a "$LOG"
