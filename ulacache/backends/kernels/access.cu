// Data-parallel kernels of the sparse-access pipeline (docs/architecture.md, PB-LRU; exact semantics in ../README.md).
// Every kernel's output order is fixed (no atomics decide an order), so results equal the numpy reference bit for bit.
// Counts that size later steps stay on the device (`*_count` arguments) so a whole access batch can run without a
// host synchronisation; the protocol wrappers read them back only where they must return an exactly-sized array.
// No includes: NVRTC compiles this without a standard library.

#define FULL_MASK 0xffffffffu

// Inclusive warp scan of v.
__device__ __forceinline__ long long warp_incl_scan(long long v) {
  int lane = threadIdx.x & 31;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    long long o = __shfl_up_sync(FULL_MASK, v, d);
    if (lane >= d) v += o;
  }
  return v;
}

// Exclusive block scan (blockDim.x <= 1024, multiple of 32); returns the prefix and writes the block total.
__device__ __forceinline__ long long block_excl_scan(long long v, long long* total) {
  __shared__ long long warp_sums[32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  long long incl = warp_incl_scan(v);
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    long long s = lane < nwarps ? warp_sums[lane] : 0;
    s = warp_incl_scan(s);
    if (lane < nwarps) warp_sums[lane] = s;
  }
  __syncthreads();
  long long before = (warp > 0 ? warp_sums[warp - 1] : 0) + incl - v;
  *total = warp_sums[nwarps - 1];
  __syncthreads();
  return before;
}

__device__ __forceinline__ long long block_sum(long long v) {
  long long total;
  block_excl_scan(v, &total);
  return total;
}

// ---- dedup: scatter a marker, then compact it in address order ---------------------------------------------------
extern "C" __global__ void dedup_mark(const long long* __restrict__ addrs, long long n, unsigned char* marker) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    long long a = addrs[i];
    if (a >= 0) marker[a] = 1;
  }
}

// Each block owns CHUNK = blockDim.x * 64 marker bytes; thread t owns 64 consecutive bytes, read as 16 words.
__device__ __forceinline__ int load_bytes64(const unsigned char* m, long long pos, long long len, unsigned int w[16]) {
  int c = 0;
  if (pos + 64 <= len && ((pos & 15) == 0)) {
    const uint4* p = reinterpret_cast<const uint4*>(m + pos);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      uint4 v = p[k];
      w[4 * k] = v.x; w[4 * k + 1] = v.y; w[4 * k + 2] = v.z; w[4 * k + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      unsigned int x = 0;
      for (int b = 0; b < 4; ++b) {
        long long j = pos + 4 * k + b;
        if (j < len && m[j]) x |= 1u << (8 * b);
      }
      w[k] = x;
    }
  }
#pragma unroll
  for (int k = 0; k < 16; ++k) c += __popc(w[k]);  // marker bytes are 0 or 1
  return c;
}

extern "C" __global__ void dedup_count(const unsigned char* __restrict__ marker, long long len,
                                       long long* __restrict__ block_counts) {
  long long pos = (blockIdx.x * (long long)blockDim.x + threadIdx.x) * 64;
  unsigned int w[16];
  int c = pos < len ? load_bytes64(marker, pos, len, w) : 0;
  long long t = block_sum(c);
  if (threadIdx.x == 0) block_counts[blockIdx.x] = t;
}

// Writes the marked positions ascending into out, clears the marker, and writes the total to out_count[0].
extern "C" __global__ void dedup_emit(unsigned char* marker, long long len, const long long* __restrict__ block_counts,
                                      long long* __restrict__ out, long long* __restrict__ out_count) {
  long long off = 0;
  for (int b = threadIdx.x; b < (int)blockIdx.x; b += blockDim.x) off += block_counts[b];
  off = block_sum(off);
  long long pos = (blockIdx.x * (long long)blockDim.x + threadIdx.x) * 64;
  unsigned int w[16];
  int c = pos < len ? load_bytes64(marker, pos, len, w) : 0;
  long long total;
  long long k = off + block_excl_scan(c, &total);
  if (c) {
#pragma unroll
    for (int q = 0; q < 16; ++q) {
      unsigned int x = w[q];
      while (x) {
        int b = (__ffs(x) - 1) >> 3;
        out[k++] = pos + 4 * q + b;
        x &= ~(0xffu << (8 * b));
      }
    }
    if (pos + 64 <= len && ((pos & 15) == 0)) {
      uint4* p = reinterpret_cast<uint4*>(marker + pos);
      uint4 z = make_uint4(0, 0, 0, 0);
      p[0] = z; p[1] = z; p[2] = z; p[3] = z;
    } else {
      for (long long j = pos; j < pos + 64 && j < len; ++j) marker[j] = 0;
    }
  }
  if (blockIdx.x == gridDim.x - 1 && threadIdx.x == 0) out_count[0] = off + total;
}

// ---- bitmaps ------------------------------------------------------------------------------------------------------
extern "C" __global__ void bitmap_write(unsigned int* bm, const long long* __restrict__ slots, long long n, int set) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    long long s = slots[i];
    unsigned int bit = 1u << (s & 31);
    if (set) atomicOr(bm + (s >> 5), bit);
    else atomicAnd(bm + (s >> 5), ~bit);
  }
}

// Summary: bit w set <=> 64-bit word w non-zero. One thread per word, 32 words per warp ballot -> one uint32.
extern "C" __global__ void bitmap_summary(const unsigned long long* __restrict__ words, long long nwords,
                                          unsigned int* __restrict__ summary, long long nsum32) {
  long long w = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  bool nz = w < nwords && words[w] != 0ull;
  unsigned int b = __ballot_sync(FULL_MASK, nz);
  if ((threadIdx.x & 31) == 0 && (w >> 5) < nsum32) summary[w >> 5] = b;
}

// ---- select_first: per segment the lowest `counts[r]` set slots -----------------------------------------------------
// Grid: (chunks_per_seg, num_segments); a block owns WPB = blockDim.x * WPT words of its segment.
#define WPT 1  // words per thread (v1 used 4: 16 blocks for a 1M-slot segment was too few)
__device__ __forceinline__ int chunk_popc(const unsigned long long* words, const unsigned int* summary,
                                          long long w0, long long wend, unsigned long long* mine) {
  int c = 0;
#pragma unroll
  for (int k = 0; k < WPT; ++k) {
    long long w = w0 + k;
    unsigned long long v = 0;
    if (w < wend && ((summary[w >> 5] >> (w & 31)) & 1u)) v = words[w];
    mine[k] = v;
    c += __popcll(v);
  }
  return c;
}

extern "C" __global__ void select_count(const unsigned long long* __restrict__ words,
                                        const unsigned int* __restrict__ summary, long long words_per_seg,
                                        long long* __restrict__ chunk_counts) {
  long long seg = blockIdx.y, wbase = seg * words_per_seg, wend = wbase + words_per_seg;
  long long w0 = wbase + ((long long)blockIdx.x * blockDim.x + threadIdx.x) * WPT;
  unsigned long long mine[WPT];
  int c = chunk_popc(words, summary, w0, wend, mine);
  long long t = block_sum(c);
  if (threadIdx.x == 0) chunk_counts[seg * gridDim.x + blockIdx.x] = t;
}

// counts: int64[num_segments] wanted per segment. out: capacity >= sum(min(counts, set bits)); found[r] written.
extern "C" __global__ void select_emit(const unsigned long long* __restrict__ words,
                                       const unsigned int* __restrict__ summary, long long words_per_seg,
                                       const long long* __restrict__ chunk_counts, const long long* __restrict__ counts,
                                       long long* __restrict__ out, long long* __restrict__ found,
                                       long long* __restrict__ out_count) {
  __shared__ long long s_seg_off, s_chunk_off, s_want;
  const int nch = gridDim.x, nseg = gridDim.y;
  long long seg = blockIdx.y;
  if (threadIdx.x == 0) {
    long long seg_off = 0, all = 0;
    for (int r = 0; r < nseg; ++r) {
      long long tot = 0;
      for (int c = 0; c < nch; ++c) tot += chunk_counts[r * nch + c];
      long long f = counts[r] < tot ? counts[r] : tot;
      if (f < 0) f = 0;
      if (r < seg) seg_off += f;
      all += f;
      if (r == seg && blockIdx.x == 0) found[r] = f;
    }
    long long chunk_off = 0;
    for (int c = 0; c < (int)blockIdx.x; ++c) chunk_off += chunk_counts[seg * nch + c];
    s_seg_off = seg_off;
    s_chunk_off = chunk_off;
    s_want = counts[seg];
    if (seg == nseg - 1 && blockIdx.x == 0) out_count[0] = all;
  }
  __syncthreads();
  long long want = s_want;
  if (s_chunk_off >= want) return;  // uniform across the block
  long long wbase = seg * words_per_seg, wend = wbase + words_per_seg;
  long long w0 = wbase + ((long long)blockIdx.x * blockDim.x + threadIdx.x) * WPT;
  unsigned long long mine[WPT];
  int c = chunk_popc(words, summary, w0, wend, mine);
  long long total;
  long long before = s_chunk_off + block_excl_scan(c, &total);
  if (before >= want) return;
  long long o = s_seg_off + before;
#pragma unroll
  for (int k = 0; k < WPT; ++k) {
    unsigned long long v = mine[k];
    while (v && before < want) {
      int b = __ffsll((long long)v) - 1;
      out[o++] = (w0 + k) * 64 + b;
      ++before;
      v &= v - 1;
    }
  }
}

// ---- vectorised row gather / scatter inside one pool (payload mode) -----------------------------------------------
extern "C" __global__ void rows_gather(const uint4* __restrict__ pool, const long long* __restrict__ idx,
                                       uint4* __restrict__ out, long long n, int vpr) {
  long long total = n * vpr;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
       e += (long long)gridDim.x * blockDim.x) {
    long long r = e / vpr;
    int k = (int)(e - r * vpr);
    out[e] = pool[idx[r] * vpr + k];
  }
}

extern "C" __global__ void rows_scatter(uint4* __restrict__ pool, const long long* __restrict__ idx,
                                        const uint4* __restrict__ rows, long long n, int vpr) {
  long long total = n * vpr;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
       e += (long long)gridDim.x * blockDim.x) {
    long long r = e / vpr;
    int k = (int)(e - r * vpr);
    pool[idx[r] * vpr + k] = rows[e];
  }
}
