"""DeviceSelections (traces/synthetic/device.py): the synthetic generator's draws on a CUDA device give the host
generator's positions bit for bit (`-m gpu`: the CUDA kernel itself; here: the host side of the device path with a
numpy transliteration of draw.cu in the kernel's place, so a change to the generator that the kernel does not
follow fails in CI too), and the fallbacks answer as the host does."""
import numpy as np
import pytest

import sim
import traces
from sim.policy_backend import cuda_device_count
from traces.synthetic.device import DeviceSelections, selections_on_device
from traces.synthetic.source import SyntheticSelections
from traces.synthetic.spec import SelectionSpec

SPECS = [({"num_groups": 6, "early_groups": 2, "top_k": 256}, 3), ({"num_groups": 21, "top_k": 2048}, 0)]


def _cases(spec: SelectionSpec, rng):
    """(rids, hists, steps, q): one row, a few rows of several strata domains, a batch past the few-rows path."""
    k = spec.top_k
    for r in (1, 3, 40):
        for q in (1, 4):
            yield rng.integers(0, 1 << 40, r), rng.integers(4 * k, 60 * k, r), rng.integers(0, 9000, r), q
    yield np.array([5, 6]), np.array([k + 1, 30 * k]), np.array([1, 2]), 2  # a dense short row: the host path
    yield np.array([7]), np.array([k]), np.array([3]), 3  # a history of top_k: the host path


def _check(dev: DeviceSelections, host: SyntheticSelections, rng) -> None:
    groups = list(range(host.num_groups))
    for rid, hist, step, q in _cases(host.spec, rng):
        want = host.select_groups(rid, hist, step, groups, q)
        got = dev.select_groups(rid, hist, step, groups, q)
        assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(want, got))
        g = groups[-1]
        assert np.array_equal(host.select(rid, hist, step, g, q), dev.select(rid, hist, step, g, q))
    assert dev.device_calls >= 12 and dev.host_calls >= 4  # both paths answered


@pytest.mark.gpu
@pytest.mark.parametrize("spec,seed", SPECS)
def test_device_draws_equal_the_host_generator(spec, seed):
    if cuda_device_count() == 0:
        pytest.skip("no CUDA device")
    spec = SelectionSpec.from_dict(spec)
    _check(DeviceSelections(spec, seed), SyntheticSelections(spec, seed), np.random.default_rng(seed))


@pytest.mark.gpu
def test_cupy_replay_of_a_paper_config_draws_on_the_device_with_numpy_metrics():
    """Long histories (the device path), every group, every request, 3 processes forked before any draw."""
    if cuda_device_count() == 0:
        pytest.skip("no CUDA device")
    sets = ["workload.num_requests=4", "workload.max_concurrency=4", "workload.max_steps=3",
            "fidelity.policy_groups=0", "fidelity.request_fraction=1.0"]
    ref = sim.replay("configs/paper-h200-tp-specon.yaml", None, overrides=sets, policy_backend="numpy")
    got = sim.replay("configs/paper-h200-tp-specon.yaml", None, overrides=sets, policy_backend="cupy",
                     policy_workers=3)
    assert ref["selections_on"] == "host" and got["selections_on"] == "device"
    for key in ("gpu_hit_rate", "decode_throughput_tok_s", "policy_calls", "decode_steps"):
        assert got[key] == ref[key]


# ---- CPU: the device path's host side, with a numpy transliteration of draw.cu as the kernel
class _Arr(np.ndarray):
    def get(self):
        return np.asarray(self)


class _NumpyAsCupy:
    int64 = np.int64

    @staticmethod
    def asarray(a):
        return np.asarray(a).view(_Arr)

    @staticmethod
    def empty(shape, dtype):
        return np.empty(shape, dtype).view(_Arr)


def _draw_strata(grid, block, args):
    """draw.cu's draw_strata, statement for statement, one (group, row) at a time (wrapping uint32 / int32)."""
    itab, utab, hist, step32, rowkey, stepkey, dom_index, qk, out, g_n, r_n, q, k, s, w, early, shift, thr1 = args
    g_n, r_n, q, k, s, w, early = (int(x) for x in (g_n, r_n, q, k, s, w, early))
    u, i32, kp = np.uint32, np.int32, k - s - w
    with np.errstate(over="ignore"):
        for g in range(g_n):
            for r in range(r_n):
                ti, tu = itab[dom_index[r], g], utab[dom_index[r], g]
                h, st = i32(hist[r] - s - w), u(step32[r])
                invalid = ti[0] > h
                lo = (np.where(invalid, ti[2], 0) + ti[1]).astype(i32)
                ln = (np.where(invalid, ti[4], 0) + np.where(ti[5] > h, ti[6], 0) + ti[3]).astype(i32)
                ln = np.where(invalid, ln, np.minimum(ln, h - ti[7])).astype(i32)
                if early:
                    par = ((tu[6] ^ (st & u(1))) * (ln > 1).astype(u)) & tu[7]
                    lo = (lo + par.view(i32)).astype(i32)
                    ln = ((ln - par.view(i32) + 1) >> 1).astype(i32)
                mult = np.where(tu[7] != 0, ln.view(u), tu[2]).astype(u)
                t = u(rowkey[r]) * tu[8]
                ck = (st + tu[0]) >> u(shift)
                ck = ((((ck * u(0xC2B2AE35)) ^ t) * u(0x9E3779B1)) >> u(16)) * tu[1] >> u(16)
                lo = (lo.view(u) + ck).view(i32)
                ts = (t ^ u(stepkey[r])) * u(0x846CA68B)
                diverge = (u(thr1) - (ts >> u(16))) >> u(31)
                mask = tu[5] if early else u(0xFFFFFFFF)
                for qi in range(q):
                    d = (ts if qi == 0 else (diverge * u(qk[qi])) ^ ts) * u(0x2C1B3C6D)
                    d = (((d >> tu[3]) * mult) >> tu[4]) & mask
                    out[g, r, qi, s:s + kp] = (lo.view(u) + d).view(i32)
                out[g, r, :, :s] = np.arange(s)
                out[g, r, :, k - w:] = hist[r] + np.arange(-w, 0)


@pytest.mark.parametrize("spec,seed", SPECS)
def test_device_path_host_side_with_the_kernel_transliterated(spec, seed):
    spec = SelectionSpec.from_dict(spec)
    dev = DeviceSelections(spec, seed)
    dev.bind(_NumpyAsCupy, _draw_strata)
    _check(dev, SyntheticSelections(spec, seed), np.random.default_rng(seed))


def test_only_the_synthetic_generator_moves_to_the_device():
    src = SyntheticSelections(SelectionSpec.from_dict({"num_groups": 2, "top_k": 256}), 5)
    dev = selections_on_device(src)
    assert type(dev) is DeviceSelections and (dev.spec, dev.seed) == (src.spec, src.seed)
    assert src.draws_on == "host" and dev.draws_on == "device"
    assert selections_on_device(dev) is dev
    other = object()
    assert traces.selections_on_device(other) is other
