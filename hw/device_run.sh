#!/usr/bin/env bash
# One device call: GPU tests, then the requested hw commands; logs and JSON under $OUT (default ./out/device).
# Usage on the device machine: bash hw/device_run.sh "tests bench calibrate validate"
set -uo pipefail
OUT=${OUT:-out/device}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
for step in ${1:-tests bench}; do
  echo "=== $step $(date -u +%H:%M:%S)"
  case $step in
    tests) timeout 240 python3 -m pytest -q -x -m gpu tests/test_backend_parity.py tests/test_hw_gpu.py -p no:cacheprovider \
             2>&1 | tee "$OUT/tests.log" | tail -25 ;;
    bench) timeout 300 python3 -m hw bench --out "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" ;;
    calibrate) timeout 300 python3 -m hw calibrate --out "$OUT/h200.yaml" --json "$OUT/calibration.json" 2>&1 \
             | tee "$OUT/calibrate.log" ;;
    validate) timeout 240 python3 -m hw validate synthetic --ranks 1 --calibration "$OUT/h200.yaml" \
                --out "$OUT/validate_dp1.json" 2>&1 | tee "$OUT/validate_dp1.log"
              timeout 240 python3 -m hw validate synthetic --ranks 2 --calibration "$OUT/h200.yaml" \
                --out "$OUT/validate_tp2.json" 2>&1 | tee "$OUT/validate_tp2.log" ;;
  esac
done
echo "=== done $(date -u +%H:%M:%S)"
