"""hw: the real-hardware validator (docs/architecture.md). Runs the library's policy kernels and real KV transfers on GPUs,
calibrates the simulator's cost model and checks its predictions.

Commands (`ulacache hw ...`, or `python -m hw ...` on a device host; their parsers are ulacache_cli/hw.py): `bench`
(bench.py), `calibrate` (calibrate.py), `validate` (validate.py). Pieces: gpu.py (device facts, event timing, copy ceilings), pipeline.py
(device-resident pb-lru access batch, bit-exact with the facade), copybench.py / accessbench.py (benchmarks),
executors.py (pools per rank, real transfers), workload.py (synthetic decode batches), fit.py (fits). cupy is
imported only inside functions; NOTES.md logs each kernel version with its prediction and measurement.
"""
