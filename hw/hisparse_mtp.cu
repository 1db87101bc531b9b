// HiSparse MTP (speculative verify) swap-in, shaped like SGLang's hisparse_mtp_swap.cuh: one plan for all verify
// steps of a layer in a launch pair. See hw/hisparse_mtp.py for the state, the semantics and the numpy oracle.
//  gather: grid (B, ceil(T / 64)), 64 threads; each lane resolves one occurrence (flattened occ = step * K + k,
//          lanes interleaved so one warp holds the same k of every step); hits mark their slot's epoch; misses are
//          deduplicated in an epoch-tagged per-request table, the first claimer copies the row from pinned host into
//          a scratch row (one warp per row, 16-B vectors) - the multi-block gather.
//  commit: grid B, 512 threads; orders the unique misses by first occurrence, picks victims (sampled CLOCK, or the
//          overflow admission), rotates scratch rows into the victim slots (no second copy), advances the cursor.
#define KNUTH 2654435761u
#define CLOCK_SAMPLES 6
#define SCR_MASK 0x7fffffffu

__device__ __forceinline__ int mtp_epoch_next(int e, int H) {
  int cb = 0;
  while ((1 << cb) < H) cb++;
  if (cb < 1) cb = 1;
  const int eb = (32 - cb) < 23 ? (32 - cb) : 23;
  const int mask = (int)((1u << eb) - 1u);
  const int n = (e + 1) & mask;
  return n ? n : 1;
}

__device__ __forceinline__ int mtp_epoch_mask(int H) {
  int cb = 0;
  while ((1 << cb) < H) cb++;
  if (cb < 1) cb = 1;
  const int eb = (32 - cb) < 23 ? (32 - cb) : 23;
  return (int)((1u << eb) - 1u);
}

__device__ __forceinline__ int mtp_hash(int key, int size) {
  return (int)(((unsigned)key * KNUTH) % (unsigned)size);
}

extern "C" __global__ void hisparse_mtp_gather(
    const int* __restrict__ topk, const long long* __restrict__ seq_steps, const int* __restrict__ buf_tok,
    const int* __restrict__ dev_locs, const int* __restrict__ slot_of, const long long* __restrict__ host_locs,
    int* __restrict__ ref, const int* __restrict__ epoch_state, const int* __restrict__ scratch_locs,
    unsigned long long* __restrict__ scr_key, unsigned long long* __restrict__ scr_idx, int* __restrict__ scr_first,
    int* __restrict__ compact, int* __restrict__ counters, int* __restrict__ out, const uint4* __restrict__ host,
    uint4* __restrict__ dev, int K, int steps, int H, int P, int S, int T, int vec_per_row, int skip_io) {
  const int b = blockIdx.x, tid = threadIdx.x, lane = tid & 31;
  const int nwarps_blk = blockDim.x >> 5;
  const int total_warps = gridDim.y * nwarps_blk;
  const int gw = blockIdx.y * nwarps_blk + (tid >> 5);
  const int occ = lane * total_warps + gw;
  const int* tk = topk + (long long)b * T;
  const int* btok = buf_tok + (long long)b * (H + P);
  const int* dloc = dev_locs + (long long)b * (H + P);
  const int* sof = slot_of + (long long)b * S;
  int* bref = ref + (long long)b * H;
  unsigned long long* skey = scr_key + (long long)b * T;
  unsigned long long* sidx = scr_idx + (long long)b * T;
  int* sfirst = scr_first + (long long)b * T;
  int* cnt = counters + 3 * b;
  const int epoch = mtp_epoch_next(epoch_state[b], H);
  unsigned se = ((unsigned)cnt[2] & SCR_MASK) + 1u;
  if (se > SCR_MASK) se = 1u;
  const unsigned long long ebits = (unsigned long long)se << 32;

  int token = -1, loc = -1, slot = -1;
  bool need = false, owner = false;
  long long src = -1;
  if (occ < T) {
    const int step = occ / K;
    token = tk[occ];
    const long long seq = seq_steps[(long long)b * steps + step];
    if (token >= 0 && token < seq) {
      if ((long long)token >= seq - P) {
        for (int j = 0; j < P; j++) {
          if (btok[H + j] == token) {
            loc = dloc[H + j];
            break;
          }
        }
      }
      need = loc < 0;
    }
  }
  // the same k of every step sits in one warp: equal tokens there share the owner lane's lookup
  int owner_lane = lane;
  bool reuse = false;
  if (total_warps <= K && K % total_warps == 0) {
    const int lps = K / total_warps;
    if (lps > 0 && steps * lps <= 32) {
      owner_lane = lane % lps;
      const int ot = __shfl_sync(0xffffffffu, token, owner_lane);
      const int on = __shfl_sync(0xffffffffu, need ? 1 : 0, owner_lane);
      reuse = need && lane != owner_lane && on && ot == token;
    }
  }
  if (need && !reuse) {
    slot = sof[token];
    if (slot >= 0 && btok[slot] != token) slot = -1;
    if (slot >= 0) {
      loc = dloc[slot];
    } else {
      src = host_locs[(long long)b * S + token];
      const unsigned long long packed = ebits | (unsigned)token;
      int h = mtp_hash(token, T);
      for (int a = 0; a < T; a++) {
        const unsigned long long old = atomicCAS(skey + h, 0ull, 0ull);
        if ((unsigned)(old >> 32) != se) {
          if (atomicCAS(skey + h, old, packed) == old) {
            const int u = atomicAdd(cnt, 1);
            compact[(long long)b * T + u] = h;
            sfirst[h] = occ;
            __threadfence();
            atomicExch(sidx + h, ebits | (unsigned)u);
            loc = scratch_locs[(long long)b * T + u];
            owner = true;
            break;
          }
          continue;
        }
        if ((unsigned)old == (unsigned)token) {
          unsigned long long e = atomicCAS(sidx + h, 0ull, 0ull);
          while ((unsigned)(e >> 32) != se) e = atomicCAS(sidx + h, 0ull, 0ull);
          atomicMin(sfirst + h, occ);
          loc = scratch_locs[(long long)b * T + (int)(unsigned)e];
          break;
        }
        h = (h + 1 == T) ? 0 : h + 1;
      }
    }
  }
  const int oloc = __shfl_sync(0xffffffffu, loc, owner_lane);
  const int oslot = __shfl_sync(0xffffffffu, slot, owner_lane);
  if (reuse) {
    loc = oloc;
    slot = oslot;
  }
  if (slot >= 0 && atomicExch(bref + slot, epoch) != epoch) atomicAdd(cnt + 1, 1);
  if (occ < T) out[(long long)b * T + occ] = loc;
  if (skip_io) return;
  unsigned mask = __ballot_sync(0xffffffffu, owner);
  while (mask) {
    const int l = __ffs(mask) - 1;
    const long long s = __shfl_sync(0xffffffffu, src, l);
    const int d = __shfl_sync(0xffffffffu, loc, l);
    const uint4* from = host + s * vec_per_row;
    uint4* to = dev + (long long)d * vec_per_row;
    for (int v = lane; v < vec_per_row; v += 32) to[v] = from[v];
    mask &= mask - 1;
  }
}

// Exclusive block scan over n ints in s (in place), n <= 32 * blockDim.x * per; returns the total.
__device__ int mtp_block_exscan(int* s, int n, int* wtot) {
  const int BS = blockDim.x, t = threadIdx.x, lane = t & 31, w = t >> 5, nw = BS >> 5;
  const int per = (n + BS - 1) / BS, lo = min(n, t * per), hi = min(n, lo + per);
  int sum = 0;
  for (int i = lo; i < hi; i++) sum += s[i];
  int x = sum;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) wtot[w] = x;
  __syncthreads();
  if (w == 0) {
    int v = lane < nw ? wtot[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += y;
    }
    if (lane < nw) wtot[lane] = v;
  }
  __syncthreads();
  int run = (w ? wtot[w - 1] : 0) + x - sum;
  const int total = wtot[nw - 1];
  for (int i = lo; i < hi; i++) {
    const int v = s[i];
    s[i] = run;
    run += v;
  }
  __syncthreads();
  return total;
}

// Overflow admission of admitted miss i of M: probe the hashed slots (lin * KNUTH + epoch) % H, lin = i, i + M, ...;
// claim the first not referenced this epoch (mark it), or leave the miss without a victim (-1).
__device__ __forceinline__ int mtp_hashed_victim(int* bref, int i, int M, int epoch, int H) {
  for (int lin = i; lin < H; lin += M) {
    const int c = (int)(((unsigned)lin * KNUTH + (unsigned)epoch) % (unsigned)H);
    if (bref[c] == epoch) continue;
    bref[c] = epoch;
    return c;
  }
  return -1;
}

__device__ int mtp_fallback(const int* bref_c, int* bref, int cursor, int i, int epoch, int H) {
  const unsigned start = ((unsigned)cursor + (unsigned)i * KNUTH) % (unsigned)H;
  for (int a = 0; a < H; a++) {
    const int c = (int)((start + (unsigned)a * KNUTH) % (unsigned)H);
    if (bref_c[c] != epoch) {
      bref[c] = epoch;
      return c;
    }
  }
  return -1;
}

extern "C" __global__ void hisparse_mtp_commit(
    const int* __restrict__ topk, const long long* __restrict__ seq_steps, int* __restrict__ buf_tok,
    int* __restrict__ dev_locs, int* __restrict__ slot_of, int* __restrict__ ref, int* __restrict__ epoch_state,
    int* __restrict__ cursor_state, int* __restrict__ scratch_locs, const unsigned long long* __restrict__ scr_key,
    const unsigned long long* __restrict__ scr_idx, const int* __restrict__ scr_first, const int* __restrict__ compact,
    int* __restrict__ counters, int* __restrict__ miss_out, int* __restrict__ union_out, int K, int steps, int H,
    int P, int S, int T) {
  extern __shared__ int sm[];
  int* pre = sm;                  // [T] first-occurrence flags -> their ordinal
  int* inv = pre + T;             // [T] ordinal -> unique index
  int* vic = inv + T;             // [T] ordinal -> victim slot (-1 none)
  int* wtot = vic + T;            // [32]
  char* adm = (char*)(wtot + 40);  // [T] ordinal admitted (overflow path)
  const int b = blockIdx.x, t = threadIdx.x, BS = blockDim.x;
  int* cnt = counters + 3 * b;
  int* btok = buf_tok + (long long)b * (H + P);
  int* dloc = dev_locs + (long long)b * (H + P);
  int* sof = slot_of + (long long)b * S;
  int* bref = ref + (long long)b * H;
  int* sloc = scratch_locs + (long long)b * T;
  const unsigned long long* skey = scr_key + (long long)b * T;
  const unsigned long long* sidx = scr_idx + (long long)b * T;
  const int* sfirst = scr_first + (long long)b * T;
  const int* comp = compact + (long long)b * T;
  const int M = cnt[0], U = cnt[1];
  const int epoch = mtp_epoch_next(epoch_state[b], H), cursor = cursor_state[b];
  unsigned se = ((unsigned)cnt[2] & SCR_MASK) + 1u;
  if (se > SCR_MASK) se = 1u;
  if (M > 0) {
    for (int i = t; i < T; i += BS) pre[i] = 0;
    __syncthreads();
    for (int u = t; u < M; u += BS) pre[sfirst[comp[u]]] = 1;
    __syncthreads();
    mtp_block_exscan(pre, T, wtot);
    for (int u = t; u < M; u += BS) {
      const int i = pre[sfirst[comp[u]]];
      inv[i] = u;
      vic[i] = -1;
      adm[i] = 0;
    }
    __syncthreads();
    const bool use_union = M + U <= H;
    if (!use_union) {  // overflow: clear the epochs, re-mark the last step's hits, admit the last step's misses
      for (int s = t; s < H; s += BS) bref[s] = 0;
      __syncthreads();
      const long long seq = seq_steps[(long long)b * steps + steps - 1];
      for (int occ = (steps - 1) * K + t; occ < steps * K; occ += BS) {
        const int tok = topk[(long long)b * T + occ];
        if (tok < 0 || tok >= seq) continue;
        const int s = sof[tok];
        if (s >= 0 && btok[s] == tok) {
          bref[s] = epoch;
          continue;
        }
        int h = mtp_hash(tok, T);
        for (int a = 0; a < T; a++) {
          const unsigned long long k = skey[h];
          if ((unsigned)(k >> 32) != se) break;
          if ((unsigned)k == (unsigned)tok) {
            if ((unsigned)(sidx[h] >> 32) == se) adm[pre[sfirst[h]]] = 1;
            break;
          }
          h = (h + 1 == T) ? 0 : h + 1;
        }
      }
      __syncthreads();
    }
    const int emask = mtp_epoch_mask(H);
    if (use_union) {  // sampled CLOCK: disjoint ring partitions, oldest unreferenced of <= 6 samples
      for (int i = t; i < M; i += BS) {
        const int part = (H - 1 - i) / M + 1, ns = min(part, CLOCK_SAMPLES);
        int best = -1;
        unsigned oldest = 0;
        for (int s = 0; s < ns; s++) {
          const int c = (cursor + i + (s * part / ns) * M) % H;
          const int r = bref[c];
          if (r == epoch) continue;
          const unsigned age = (unsigned)(epoch - r) & (unsigned)emask;
          if (best < 0 || age > oldest) {
            best = c;
            oldest = age;
          }
        }
        if (best >= 0) bref[best] = epoch;
        vic[i] = best;
      }
    } else if ((H & (H - 1)) == 0) {  // hashed victims, disjoint when H is a power of two
      for (int i = t; i < M; i += BS)
        if (adm[i]) vic[i] = mtp_hashed_victim(bref, i, M, epoch, H);
    } else if (t == 0) {  // other H: the same probes, one at a time in ordinal order
      for (int i = 0; i < M; i++)
        if (adm[i]) vic[i] = mtp_hashed_victim(bref, i, M, epoch, H);
    }
    __syncthreads();
    if (t == 0) {
      for (int i = 0; i < M; i++) {
        if (vic[i] < 0 && (use_union || adm[i])) vic[i] = mtp_fallback(bref, bref, cursor, i, epoch, H);
      }
    }
    __syncthreads();
    for (int i = t; i < M; i += BS) {  // rotate: the victim slot takes the scratch row (already holding the bytes)
      const int v = vic[i];
      if (v < 0) continue;
      const int u = inv[i];
      const int tok = (int)(unsigned)skey[comp[u]];
      const int old_loc = dloc[v], old_tok = btok[v];
      dloc[v] = sloc[u];
      sloc[u] = old_loc;
      btok[v] = tok;
      bref[v] = epoch;
      if (old_tok >= 0) sof[old_tok] = -1;
      sof[tok] = v;
    }
  }
  __syncthreads();
  if (t == 0) {
    epoch_state[b] = epoch;
    if (M > 0) cursor_state[b] = (cursor + min(M, H)) % H;
    miss_out[b] = M;
    union_out[b] = U;
    cnt[0] = 0;
    cnt[1] = 0;
    cnt[2] = (int)se;
  }
}
