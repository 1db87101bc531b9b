// Device-resident PB-LRU access batch (docs/architecture.md: PB-LRU, KV exchange), the sync-free form of the facade's exclusive-policy access:
// dedup (access.cu) -> translate + hit detection -> misses grouped by home rank (ascending address) -> the epoch
// rule (policies/pblru.py: maybe rotate the ring) -> recency update of the hits -> replacement slots from the free
// bitmap, the cold bucket, then recent buckets oldest -> newest (lowest slot first per segment) -> victims; commit
// updates mapping, owners, stamps and the current bucket. The bucket clock lives in device memory (clock[0] epoch,
// clock[1] GPU insertions during it, clock[2] whether this batch rotated), as do all counts, so a whole batch is one
// CUDA-graph-capturable launch sequence.
// Layouts (see ../README.md): places int64, GPU places [0, G), rank r's GPU segment [r*seg, (r+1)*seg); CPU places
// cpu_base + r*cpu_slots + c. Bucket ring: (K+1) bitmaps of G bits (epoch e lives in row e % (K+1)); cold: G bits.
// Appended to access.cu (uses block_excl_scan / block_sum / WPT / chunk_popc).

#define ITEMS 8

__device__ __forceinline__ void bit_clear(unsigned int* bm, long long s) { atomicAnd(bm + (s >> 5), ~(1u << (s & 31))); }
__device__ __forceinline__ void bit_set(unsigned int* bm, long long s) { atomicOr(bm + (s >> 5), 1u << (s & 31)); }

// Victims of the chosen slots, and the exchange count.
extern "C" __global__ void pipe_victims(const long long* __restrict__ dests, const long long* __restrict__ mbase, int R,
                                        const long long* __restrict__ owner, long long* __restrict__ victims,
                                        long long* exch_count) {
  const long long n = mbase[R];
  long long mine = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    long long v = owner[dests[i]];
    victims[i] = v;
    mine += v >= 0;
  }
  long long t = block_sum(mine);
  if (threadIdx.x == 0 && t) atomicAdd((unsigned long long*)exch_count, (unsigned long long)t);
}

// Commit (after the transfers): mapping, owners, stamps; the chosen slots join the current bucket.
extern "C" __global__ void pipe_commit(const long long* __restrict__ dests, const long long* __restrict__ mbase, int R,
                                       const long long* __restrict__ miss_addr, const long long* __restrict__ miss_src,
                                       const long long* __restrict__ victims, long long* phys, long long* owner,
                                       long long* stamps, const long long* __restrict__ clock, int K, long long G,
                                       unsigned int* ring) {
  const long long n = mbase[R], now = clock[0];
  unsigned int* cur = ring + (now % (K + 1)) * (G >> 5);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    long long d = dests[i], v = victims[i];
    phys[miss_addr[i]] = d;
    if (v >= 0) phys[v] = miss_src[i];
    owner[d] = miss_addr[i];
    stamps[d] = now;
    bit_set(cur, d);
  }
}

// Members of the current ring row per rank: grid (chunks, R), one word per thread; adds into cur_counts[r].
extern "C" __global__ void pipe_cur_count(const unsigned long long* __restrict__ ring, long long row_words,
                                          long long wps, const long long* __restrict__ clock, int K,
                                          long long* cur_counts) {
  const int r = blockIdx.y;
  const unsigned long long* words = ring + (clock[0] % (K + 1)) * row_words + r * wps;
  long long w = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  long long t = block_sum(w < wps ? __popcll(words[w]) : 0);
  if (threadIdx.x == 0 && t) atomicAdd((unsigned long long*)(cur_counts + r), (unsigned long long)t);
}

// The epoch rule (one thread): end the epoch when its GPU insertions reached `volume`, or when on some rank current
// members + this batch's hits + misses exceed its slots; then count this batch's misses as insertions.
extern "C" __global__ void pipe_epoch(const long long* __restrict__ cur_counts, const long long* __restrict__ rank_hits,
                                      const long long* __restrict__ mbase, int R, long long slots, long long volume,
                                      long long* clock) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  bool rot = clock[1] >= volume;
  for (int r = 0; r < R && !rot; ++r) rot = cur_counts[r] + rank_hits[r] + (mbase[r + 1] - mbase[r]) > slots;
  if (rot) {
    clock[0] += 1;
    clock[1] = 0;
  }
  clock[1] += mbase[R];
  clock[2] = rot;
}

// rotate: when this batch opened an epoch, the ring row about to hold it (the oldest recent bucket) turns cold.
extern "C" __global__ void pipe_rotate(unsigned long long* ring, unsigned long long* cold, long long nwords,
                                       const long long* __restrict__ clock, int K) {
  if (!clock[2]) return;
  unsigned long long* ring_row = ring + (clock[0] % (K + 1)) * nwords;
  for (long long w = blockIdx.x * (long long)blockDim.x + threadIdx.x; w < nwords; w += (long long)gridDim.x * blockDim.x) {
    cold[w] |= ring_row[w];
    ring_row[w] = 0ull;
  }
}

// Recency update: each hit leaves its bucket for the current one, stamp = epoch.
extern "C" __global__ void pipe_touch(const long long* __restrict__ n_uniq, const long long* __restrict__ places,
                                      long long G, long long* stamps, const long long* __restrict__ clock, int K,
                                      unsigned int* ring, unsigned int* cold) {
  const long long n = *n_uniq, now = clock[0], row_words = G >> 5;
  unsigned int* cur = ring + (now % (K + 1)) * row_words;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    long long p = places[i];
    if (p < 0 || p >= G) continue;
    long long st = stamps[p], age = now - st;
    if (age > K) bit_clear(cold, p);
    else if (age > 0) bit_clear(ring + (st % (K + 1)) * row_words, p);
    if (age > 0) bit_set(cur, p);
    stamps[p] = now;
  }
}

// ---- v2: one pass classifies (hits per rank; misses: per-rank block counts) and keeps the places -----------------
#define MAX_RANKS 8
extern "C" __global__ void pipe_classify(const long long* __restrict__ uniq, const long long* __restrict__ n_uniq,
                                         const long long* __restrict__ phys, long long G, long long seg,
                                         long long* hit_count, long long* rank_hits, long long cpu_base,
                                         long long cpu_slots, int R, long long* __restrict__ places,
                                         long long* __restrict__ block_counts) {
  const long long n = *n_uniq;
  long long i0 = (blockIdx.x * (long long)blockDim.x + threadIdx.x) * ITEMS;
  int cnt[MAX_RANKS], hcnt[MAX_RANKS];
#pragma unroll
  for (int r = 0; r < MAX_RANKS; ++r) cnt[r] = hcnt[r] = 0;
  int hits = 0;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    long long i = i0 + k;
    if (i >= n) break;
    long long p = phys[uniq[i]];
    places[i] = p;
    if (p >= 0 && p < G) {
      int r = R == 1 ? 0 : (int)(p / seg);
#pragma unroll
      for (int q = 0; q < MAX_RANKS; ++q) hcnt[q] += (q == r);
      ++hits;
    } else if (p >= G) {
      int r = R == 1 ? 0 : (int)((p - cpu_base) / cpu_slots);
#pragma unroll
      for (int q = 0; q < MAX_RANKS; ++q) cnt[q] += (q == r);
    }
  }
  long long h = block_sum(hits);
  if (threadIdx.x == 0 && h) atomicAdd((unsigned long long*)hit_count, (unsigned long long)h);
  for (int r = 0; r < R; ++r) {
    int v = 0, hv = 0;
#pragma unroll
    for (int q = 0; q < MAX_RANKS; ++q) {
      v = (q == r) ? cnt[q] : v;
      hv = (q == r) ? hcnt[q] : hv;
    }
    long long t = block_sum(v);
    if (threadIdx.x == 0) block_counts[r * gridDim.x + blockIdx.x] = t;
    long long th = block_sum(hv);
    if (threadIdx.x == 0 && th) atomicAdd((unsigned long long*)(rank_hits + r), (unsigned long long)th);
  }
}

// Misses grouped by rank (ascending address inside a rank) from the kept places; mbase[r] = start of rank r.
extern "C" __global__ void pipe_miss_emit(const long long* __restrict__ uniq, const long long* __restrict__ n_uniq,
                                           const long long* __restrict__ places, long long G, long long cpu_base,
                                           long long cpu_slots, int R, const long long* __restrict__ block_counts,
                                           long long* mbase, long long* __restrict__ miss_addr,
                                           long long* __restrict__ miss_src) {
  const long long n = *n_uniq;
  const int nb = gridDim.x;
  long long i0 = (blockIdx.x * (long long)blockDim.x + threadIdx.x) * ITEMS;
  long long p[ITEMS];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) p[k] = (i0 + k < n) ? places[i0 + k] : -1;
  long long rank_start = 0;
  for (int r = 0; r < R; ++r) {
    long long before = 0, all = 0;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
      long long v = block_counts[r * nb + b];
      all += v;
      if (b < (int)blockIdx.x) before += v;
    }
    before = block_sum(before);
    all = block_sum(all);
    int c = 0;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k)
      c += p[k] >= G && (R == 1 || (int)((p[k] - cpu_base) / cpu_slots) == r);
    long long total;
    long long o = rank_start + before + block_excl_scan(c, &total);
    if (c) {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k)
        if (p[k] >= G && (R == 1 || (int)((p[k] - cpu_base) / cpu_slots) == r)) {
          miss_addr[o] = uniq[i0 + k];
          miss_src[o] = p[k];
          ++o;
        }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) mbase[r] = rank_start;
    rank_start += all;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) mbase[R] = rank_start;
}

// Spins for `ns` nanoseconds: placed first in a stream so the host can enqueue a whole batch before the GPU starts
// (stage timings between events are then GPU time, not host launch gaps).
extern "C" __global__ void spin_ns(long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while ((long long)(t - t0) < ns);
}

// ---- replacement over all sources in three launches (count, plan, emit); hw/NOTES.md has the earlier versions ----
// Bitmaps live as rows of one array `bms`: row 0 free, row 1 cold, row 2 + i ring row i. Source s of batch `now`:
// 0 free, 1 cold, then recent ages K .. 1 (ring row (epoch - age) mod (K + 1)). chunk = blockDim.x words (WPT = 1).
__device__ __forceinline__ long long src_row(int s, long long now, int K) {
  if (s < 2) return s;
  long long age = K - (s - 2), m = (now - age) % (K + 1);
  return 2 + (m < 0 ? m + K + 1 : m);
}

extern "C" __global__ void sel_count_all(const unsigned long long* __restrict__ bms, long long row_words,
                                         long long wps, const long long* __restrict__ clock, int K,
                                         const long long* __restrict__ mbase, long long* __restrict__ counts) {
  const int c = blockIdx.x, r = blockIdx.y, s = blockIdx.z, nch = gridDim.x, R = gridDim.y;
  long long* out = counts + ((long long)s * R + r) * nch + c;
  if (mbase[r + 1] == mbase[r]) {  // this rank has no misses: nothing to find
    if (threadIdx.x == 0) *out = 0;
    return;
  }
  const unsigned long long* words = bms + src_row(s, clock[0], K) * row_words + r * wps;
  long long w = (long long)c * blockDim.x + threadIdx.x;
  int pc = w < wps ? __popcll(words[w]) : 0;
  long long t = block_sum(pc);
  if (threadIdx.x == 0) *out = t;
}

#define SEL_MAX_PAIRS 1024
// One block: per (source, rank) the number to take (want), where its slots start in dests (base), and the chunk
// prefix offsets (chunk_off) -- the scan the emit blocks need, done once.
extern "C" __global__ void sel_plan(const long long* __restrict__ counts, int nch, int R, int S,
                                    const long long* __restrict__ mbase, long long* __restrict__ want,
                                    long long* __restrict__ base, long long* __restrict__ chunk_off) {
  __shared__ long long tot[SEL_MAX_PAIRS];
  const int P = S * R;
  for (int i = threadIdx.x; i < P; i += blockDim.x) {
    long long t = 0;
    for (int c = 0; c < nch; ++c) t += counts[(long long)i * nch + c];
    tot[i] = t;
  }
  __syncthreads();
  if (threadIdx.x < R) {
    int r = threadIdx.x;
    long long rem = mbase[r + 1] - mbase[r], taken = 0;
    for (int s = 0; s < S; ++s) {
      long long t = tot[s * R + r], w = rem < t ? rem : t;
      want[s * R + r] = w;
      base[s * R + r] = mbase[r] + taken;
      taken += w;
      rem -= w;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < P; i += blockDim.x) {
    if (want[i] <= 0) continue;
    long long acc = 0;
    for (int c = 0; c < nch; ++c) {
      chunk_off[(long long)i * nch + c] = acc;
      acc += counts[(long long)i * nch + c];
    }
  }
}

extern "C" __global__ void sel_emit_all(unsigned long long* bms, long long row_words, long long wps,
                                        const long long* __restrict__ clock, int K,
                                        const long long* __restrict__ want, const long long* __restrict__ base,
                                        const long long* __restrict__ chunk_off, long long* __restrict__ dests) {
  const int c = blockIdx.x, r = blockIdx.y, s = blockIdx.z, nch = gridDim.x, R = gridDim.y;
  const long long i = (long long)s * R + r, w = want[i];
  if (w <= 0) return;
  const long long coff = chunk_off[i * nch + c];
  if (coff >= w) return;  // uniform across the block
  unsigned long long* words = bms + src_row(s, clock[0], K) * row_words + r * wps;
  long long wi = (long long)c * blockDim.x + threadIdx.x;
  unsigned long long v = wi < wps ? words[wi] : 0ull;
  long long total;
  long long before = coff + block_excl_scan(__popcll(v), &total);
  if (before >= w || !v) return;
  long long o = base[i] + before;
  unsigned long long claimed = 0;
  while (v && before < w) {
    int b = __ffsll((long long)v) - 1;
    dests[o++] = (r * wps + wi) * 64 + b;
    claimed |= 1ull << b;
    ++before;
    v &= v - 1;
  }
  words[wi] &= ~claimed;
}

// TP: copy rank r's slice of the batch's exchange lists (on GPU 0) into this GPU's memory before its exchange, so
// the exchange kernel reads its indices locally instead of over NVLink per 16-B piece. out_mb = {0, n}.
extern "C" __global__ void pipe_copy_slice(const long long* __restrict__ dests, const long long* __restrict__ src,
                                           const long long* __restrict__ victims, const long long* __restrict__ mbase,
                                           int r, long long* __restrict__ out_d, long long* __restrict__ out_s,
                                           long long* __restrict__ out_v, long long* __restrict__ out_mb) {
  const long long b = mbase[r], n = mbase[r + 1] - b;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    out_mb[0] = 0;
    out_mb[1] = n;
  }
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    out_d[i] = dests[b + i];
    out_s[i] = src[b + i];
    out_v[i] = victims[b + i];
  }
}
