// The synthetic generator's stratified selections on the device: one thread per output element (group, row, query
// token, column). Every value is the host generator's (traces/synthetic/source.py `_select_main`, geometry.py
// `batch_terms`, draws.py `draw`) computed in the same 32-bit wrapping arithmetic, so the positions are equal bit for
// bit (tests/test_device_selections.py). Tables are the host's `_tables` per strata domain, stacked:
//
//   itab [D, G, NI, kp] int32    utab [D, G, NU, kp] uint32     (D domains, G groups, kp strata)
//   row r reads domain dom_index[r]; column j of a row: j < s sink, j >= k - w recent, else stratum j - s
enum { START_CW, LO, FOLD_SHIFT, LN, FOLD_D, MIRROR_CW, HALF_D, START, NI };
enum { PHASE, CK_MULT, MULT, SH1, SH2, MASK, PAR, FRESH, KEY, NU };

extern "C" __global__ void draw_strata(
    const int* __restrict__ itab, const unsigned* __restrict__ utab,
    const long long* __restrict__ hist, const unsigned* __restrict__ step32,
    const unsigned* __restrict__ rowkey,   // row_keys32(seed key, request id) | 1
    const unsigned* __restrict__ stepkey,  // draws.step_keys(step32)
    const int* __restrict__ dom_index, const unsigned* __restrict__ qkeys,
    long long* __restrict__ out,           // [G, R, q, k]
    int G, int R, int q, int k, int s, int w, int early, unsigned drift_shift, unsigned thr1)
{
    const long long total = (long long)G * R * k;
    const unsigned MIX = 0x2C1B3C6Du;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const int j = (int)(e % k);
        const long long gr = e / k;
        const int r = (int)(gr % R), g = (int)(gr / R);
        long long* o = out + gr * q * k + j;
        if (j < s || j >= k - w) {  // sink: the position itself; recent: hist - k + j
            const long long v = j < s ? (long long)j : hist[r] - k + j;
            for (int qi = 0; qi < q; ++qi) o[(long long)qi * k] = v;
            continue;
        }
        const int kp = k - s - w, c = j - s;
        const long long dg = (long long)dom_index[r] * G + g;
        const int* ti = itab + dg * NI * kp + c;
        const unsigned* tu = utab + dg * NU * kp + c;
        const int h = (int)(hist[r] - s - w);
        const unsigned st = step32[r];
        const bool invalid = ti[START_CW * kp] > h;  // the window does not fit: folded onto the mirror stratum
        int lo = (invalid ? ti[FOLD_SHIFT * kp] : 0) + ti[LO * kp];
        int ln = (invalid ? ti[FOLD_D * kp] : 0) + (ti[MIRROR_CW * kp] > h ? ti[HALF_D * kp] : 0) + ti[LN * kp];
        if (!invalid) ln = min(ln, h - ti[START * kp]);
        const unsigned fresh = tu[FRESH * kp];
        if (early) {  // fresh picks alternate position parity from step to step
            const unsigned par = ((tu[PAR * kp] ^ (st & 1u)) * (unsigned)(ln > 1)) & fresh;
            lo += (int)par;
            ln = (ln - (int)par + 1) >> 1;
        }
        const unsigned mult = fresh ? (unsigned)ln : tu[MULT * kp];
        const unsigned t = rowkey[r] * tu[KEY * kp];
        unsigned ck = (st + tu[PHASE * kp]) >> drift_shift;  // the candidate window's offset in this drift epoch
        ck = ((((ck * 0xC2B2AE35u) ^ t) * 0x9E3779B1u) >> 16) * tu[CK_MULT * kp] >> 16;
        lo = (int)((unsigned)lo + ck);
        const unsigned ts = (t ^ stepkey[r]) * 0x846CA68Bu;
        const unsigned diverge = (thr1 - (ts >> 16)) >> 31;  // tokens > 0 redraw where this is 1
        const unsigned sh1 = tu[SH1 * kp], sh2 = tu[SH2 * kp], mask = early ? tu[MASK * kp] : 0xFFFFFFFFu;
        for (int qi = 0; qi < q; ++qi) {
            unsigned d = (qi == 0 ? ts : ((diverge * qkeys[qi]) ^ ts)) * MIX;
            d = (((d >> sh1) * mult) >> sh2) & mask;
            o[(long long)qi * k] = (long long)(int)((unsigned)lo + d);
        }
    }
}
