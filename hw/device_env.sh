# Sourced by the one-call device scripts (hw/device_hisparse.sh, bench/full_fidelity_device.sh,
# bench/full_fidelity_paper8.sh): $OUT (default out/device) made, unbuffered Python, the repo on PYTHONPATH, and the
# wheels in .whl/ installed into /tmp/site where the device image lacks simpy or hypothesis (carry .whl in the call).
# The wheels, here, once:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl simpy==4.1.2 hypothesis==6.170.27 sortedcontainers attrs
OUT=${OUT:-out/device}
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
if ! python3 -c "import simpy, hypothesis" 2>/dev/null && [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
