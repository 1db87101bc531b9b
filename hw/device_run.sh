#!/usr/bin/env bash
# One device call: GPU tests, then the requested hw steps on a node of NUM_GPUS GPUs; one log plus the JSON/YAML
# results under $OUT (default ./out/device). The device tool brings back at most 8 files, so the validation JSONs
# are packed into $OUT/validate.tar.gz.
# Usage on the device machine: bash hw/device_run.sh "tests hisparse calibrate validate validate_trace" [NUM_GPUS]
#   NUM_GPUS (default: every visible GPU): multi-GPU steps run DP-N and TP-N (and TP-2 .. TP-N/2 when N > 2).
# Steps: tests | bench | hisparse | calibrate (merges hisparse's keys when its JSON is there; on N > 1 GPUs also the
#        node model: concurrent exchanges, all-to-all gathers, gathers right after an exchange) | validate (synthetic)
#        | validate_diag (DP-N with the ranks' transfers enqueued in reverse; with the device-list exchange)
#        | validate_trace (multi-lexsum profile
#        trace, 64 requests, histories capped at 32K)
set -uo pipefail
OUT=${OUT:-out/device}
mkdir -p "$OUT" "$OUT/v"
LOG=${LOG:-$OUT/run.log}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD:${PYTHONPATH:-}
N=${2:-$(python3 -c "import cupy; print(cupy.cuda.runtime.getDeviceCount())")}
CAL="$OUT/h200.yaml"
[ -f "$CAL" ] || CAL=hw/calibration/h200.yaml
tp_sizes() { local r=2; while [ "$r" -le "$N" ]; do echo $r; r=$((r * 2)); done; }
v() { timeout 240 python3 -m hw validate "$@" --calibration "$CAL" 2>&1 | tee -a "$LOG"; }
echo "=== node of $N GPUs: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" | tee -a "$LOG"
for step in ${1:-tests bench}; do
  echo "=== $step $(date -u +%H:%M:%S)" | tee -a "$LOG"
  case $step in
    tests) timeout 300 python3 -m pytest -q -x -m gpu tests/test_backend_parity.py tests/test_hw_gpu.py \
             tests/test_hw_hisparse.py tests/test_hw_nodefit.py -p no:cacheprovider >>"$LOG" 2>&1; tail -3 "$LOG" ;;
    bench) timeout 300 python3 -m hw bench --out "$OUT/bench.json" 2>&1 | tee -a "$LOG" ;;
    hisparse) timeout 300 python3 -m hw hisparse --out "$OUT/hisparse_swapin.json" 2>&1 | tee -a "$LOG" ;;
    calibrate)
      hs=(); [ -f "$OUT/hisparse_swapin.json" ] && hs=(--hisparse-json "$OUT/hisparse_swapin.json")
      timeout 420 python3 -m hw calibrate --out "$OUT/h200.yaml" --json "$OUT/calibration.json" "${hs[@]}" 2>&1 \
        | tee -a "$LOG"
      [ -f "$OUT/h200.yaml" ] && CAL="$OUT/h200.yaml" ;;
    validate)  # synthetic: 64 requests x 16K history, 256K GPU slots per rank
      v synthetic --ranks 1 --out "$OUT/v/validate_dp1.json"
      [ "$N" -ge 2 ] && v synthetic --ranks "$N" --mode dp --out "$OUT/v/validate_dp$N.json"
      for r in $(tp_sizes); do v synthetic --ranks "$r" --mode tp --out "$OUT/v/validate_tp$r.json"; done ;;
    validate_diag)  # does a rank's exchange time follow the launch order or the GPU? (DP-N, last rank first)
      [ "$N" -ge 2 ] && v synthetic --ranks "$N" --mode dp --reverse-launch --out "$OUT/v/validate_dp${N}_reverse.json"
      [ "$N" -ge 2 ] && v synthetic --ranks "$N" --mode dp --exchange-kernel device --out "$OUT/v/validate_dp${N}_device.json"
      ;;
    validate_trace)
      python3 -m ulacache_cli trace gen --profile multi-lexsum --num-requests 64 --seed 1 --out /tmp/tr --force \
        >>"$LOG" 2>&1
      t=(/tmp/tr --steps 30 --requests 64 --history 32768)
      v "${t[@]}" --ranks 1 --gpu-slots 393216 --out "$OUT/v/validate_trace_dp1.json"
      [ "$N" -ge 2 ] && v "${t[@]}" --ranks "$N" --mode dp --gpu-slots 262144 --out "$OUT/v/validate_trace_dp$N.json"
      for r in $(tp_sizes); do
        v "${t[@]}" --ranks "$r" --mode tp --gpu-slots 262144 --out "$OUT/v/validate_trace_tp$r.json"
      done ;;
    *) echo "unknown step $step" | tee -a "$LOG" ;;
  esac
done
if ls "$OUT"/v/*.json >/dev/null 2>&1; then tar -czf "$OUT/validate.tar.gz" -C "$OUT/v" . && rm -rf "$OUT/v"; fi
rmdir "$OUT/v" 2>/dev/null
echo "=== done $(date -u +%H:%M:%S)" | tee -a "$LOG"
