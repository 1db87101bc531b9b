// HiSparse swap-in, shaped like SGLang's per-layer kernel (docs/architecture.md, HiSparse baseline): one thread block per request.
// Per request b with history length L > H (device buffer of H LRU slots + one slot H for the newest token):
//   1. hash the top-k token positions into a shared-memory table (the newest token L-1 is a hit on slot H);
//   2. walk the request's LRU order (index 0 = least recent): a slot whose token is in the top-k is a hit,
//      every other slot is evictable; hits and evictables are compacted in LRU order;
//   3. the m-th missed top-k entry (in top-k order) takes the m-th least recent evictable slot;
//   4. new LRU order = [unused evictables, missed slots (in miss order), hits (in old LRU order)] (hits -> MRU);
//   5. each warp copies missed rows straight from pinned host memory (16-B vectors) into the device buffer.
// With plan_src != 0 it also records the miss plan (host row, device row per miss) that SGLang's IndexShare skip layers
// replay with `hisparse_copy_planned` (a small fixed grid on a side stream: IO only, no plan, the slot table shared).
// Requests with L <= H take the fast path (slot = position, no IO). Top-k entries must be distinct, in [0, L).
// The numpy reference in hw/hisparse.py (`swapin_reference`) is the oracle; it must match bit for bit.
#define HS_EMPTY (-1)
#define HS_HIT (-2)

__device__ __forceinline__ int hs_hash(int key, int size) {
  return (int)(((unsigned)key * 2654435761u) % (unsigned)size);
}

// Exclusive block scan of one int per thread (blockDim.x a multiple of 32); *total gets the block sum.
__device__ int hs_block_exscan(int v, int* warp_tot, int* total) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int x = v;
  for (int o = 1; o < 32; o <<= 1) {
    int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_tot[wid] = x;
  __syncthreads();
  if (wid == 0) {
    int s = lane < nw ? warp_tot[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      int y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
    if (lane < nw) warp_tot[lane] = s;
  }
  __syncthreads();
  const int base = wid ? warp_tot[wid - 1] : 0;
  *total = warp_tot[nw - 1];
  __syncthreads();
  return base + x - v;
}

__device__ __forceinline__ int hs_lookup(const int* hkey, const int* hval, int size, int key) {
  int h = hs_hash(key, size);
  while (true) {
    const int k = hkey[h];
    if (k == key) return hval[h];
    if (k == HS_EMPTY) return -1;
    h = (h + 1 == size) ? 0 : h + 1;
  }
}

// Shared memory (dynamic, int32): hkey[2K] hval[2K] tok[K] mtok[K] order[H] warp_tot[32].
extern "C" __global__ void hisparse_swapin(
    const int* __restrict__ topk, const long long* __restrict__ seq_lens, int* __restrict__ buf_tok,
    int* __restrict__ lru, const int* __restrict__ dev_locs, const long long* __restrict__ host_locs,
    long long host_stride, const uint4* __restrict__ host, uint4* __restrict__ dev, int* __restrict__ out_locs,
    int* __restrict__ miss_count, int K, int H, int vec_per_row, int skip_io, long long* __restrict__ plan_src,
    int* __restrict__ plan_dst, int plan_stride) {
  extern __shared__ int smem[];
  const int HSZ = 2 * K;
  int* hkey = smem;
  int* hval = hkey + HSZ;
  int* tok = hval + HSZ;   // top-k token, or HS_HIT once served
  int* mtok = tok + K;     // missed tokens, compacted in top-k order
  int* order = mtok + K;   // hits forward from 0, evictables backward from H - 1 (both in LRU order)
  int* wtot = order + H;
  const int b = blockIdx.x, t = threadIdx.x, BS = blockDim.x;
  const int* tk = topk + (long long)b * K;
  int* olocs = out_locs + (long long)b * K;
  int* btok = buf_tok + (long long)b * (H + 1);
  int* blru = lru + (long long)b * H;
  const int* dloc = dev_locs + (long long)b * (H + 1);
  const long long L = seq_lens[b];
  if (L <= H) {  // fast path: the whole history sits in the buffer in order
    for (int i = t; i < K; i += BS) olocs[i] = dloc[tk[i]];
    if (t == 0) miss_count[b] = 0;
    return;
  }
  for (int i = t; i < HSZ; i += BS) hkey[i] = HS_EMPTY;
  __syncthreads();
  const int newest = (int)(L - 1);
  for (int i = t; i < K; i += BS) {
    const int x = tk[i];
    if (x == newest) {
      tok[i] = HS_HIT;
      olocs[i] = dloc[H];
    } else {
      tok[i] = x;
      int h = hs_hash(x, HSZ);
      while (true) {
        const int old = atomicCAS(&hkey[h], HS_EMPTY, x);
        if (old == HS_EMPTY || old == x) {
          hval[h] = i;
          break;
        }
        h = (h + 1 == HSZ) ? 0 : h + 1;
      }
    }
  }
  __syncthreads();
  // 2. the LRU order, a contiguous run per thread (at most 32 positions: H <= 32 * blockDim.x)
  const int per = (H + BS - 1) / BS;
  const int lo = min(H, t * per), n = min(H, lo + per) - lo;
  unsigned hitmask = 0;
  int nh = 0;
  for (int j = 0; j < n; j++) {
    const int s = blru[lo + j];
    const int x = btok[s];
    const int f = x >= 0 ? hs_lookup(hkey, hval, HSZ, x) : -1;
    if (f >= 0) {
      hitmask |= 1u << j;
      nh++;
      tok[f] = HS_HIT;
      olocs[f] = dloc[s];
    }
  }
  int tot_h, tot_e;
  int hoff = hs_block_exscan(nh, wtot, &tot_h);
  int eoff = hs_block_exscan(n - nh, wtot, &tot_e);
  for (int j = 0; j < n; j++) {
    const int s = blru[lo + j];
    if ((hitmask >> j) & 1u) order[hoff++] = s;
    else order[H - 1 - (eoff++)] = s;
  }
  __syncthreads();
  // 3. misses in top-k order take the least recent evictables
  const int per2 = (K + BS - 1) / BS;
  const int lo2 = min(K, t * per2), n2 = min(K, lo2 + per2) - lo2;
  unsigned missmask = 0;
  int nm = 0;
  for (int j = 0; j < n2; j++) {
    if (tok[lo2 + j] != HS_HIT) {
      missmask |= 1u << j;
      nm++;
    }
  }
  int tot_m;
  int moff = hs_block_exscan(nm, wtot, &tot_m);
  for (int j = 0; j < n2; j++) {
    if ((missmask >> j) & 1u) {
      const int m = moff++;
      const int x = tok[lo2 + j];
      const int s = order[H - 1 - m];
      mtok[m] = x;
      btok[s] = x;
      olocs[lo2 + j] = dloc[s];
      if (plan_src) {
        plan_src[(long long)b * plan_stride + m] = host_locs[(long long)b * host_stride + x];
        plan_dst[(long long)b * plan_stride + m] = dloc[s];
      }
    }
  }
  __syncthreads();
  // 4. LRU write-back: [evictables M..E), missed slots, hits]
  const int E = H - tot_h, M = tot_m;
  for (int i = t; i < H; i += BS) {
    int s;
    if (i < E - M) s = order[H - 1 - (M + i)];
    else if (i < E) s = order[H - 1 - (i - (E - M))];
    else s = order[i - E];
    blru[i] = s;
  }
  if (t == 0) miss_count[b] = M;
  if (skip_io) return;
  // 5. one warp per missed row, pinned host -> device buffer
  const int lane = t & 31, w = t >> 5, nw = BS >> 5;
  for (int m = w; m < M; m += nw) {
    const int x = mtok[m];
    const int s = order[H - 1 - m];
    const uint4* src = host + host_locs[(long long)b * host_stride + x] * vec_per_row;
    uint4* dst = dev + (long long)dloc[s] * vec_per_row;
    for (int v = lane; v < vec_per_row; v += 32) dst[v] = src[v];
  }
}

// IO-only replay of a recorded miss plan (SGLang's copy_cache_planned for IndexShare skip layers): a fixed grid; the
// warps round-robin over the flattened (request, miss) list so a few blocks spread over every request's misses.
extern "C" __global__ void hisparse_copy_planned(
    const long long* __restrict__ plan_src, const int* __restrict__ plan_dst, const int* __restrict__ miss_count,
    int B, int plan_stride, const uint4* __restrict__ host, uint4* __restrict__ dev, int vec_per_row) {
  const int lane = threadIdx.x & 31;
  const int nw_total = gridDim.x * (blockDim.x >> 5);
  const int w = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  int start = 0;  // flat index of the current request's first miss
  for (int base = 0; base < B; base += 32) {
    const int r = base + lane;
    const int c_lane = r < B ? miss_count[r] : 0;
    const int window = min(32, B - base);
    for (int j = 0; j < window; j++) {
      const int c = __shfl_sync(0xffffffffu, c_lane, j);
      if (c == 0) continue;
      int m = (w - start) % nw_total;
      if (m < 0) m += nw_total;
      const long long* src = plan_src + (long long)(base + j) * plan_stride;
      const int* dst = plan_dst + (long long)(base + j) * plan_stride;
      for (; m < c; m += nw_total) {
        const uint4* from = host + src[m] * vec_per_row;
        uint4* to = dev + (long long)dst[m] * vec_per_row;
        for (int v = lane; v < vec_per_row; v += 32) to[v] = from[v];
      }
      start += c;
    }
  }
}
