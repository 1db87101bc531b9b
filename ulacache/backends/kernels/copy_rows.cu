// Row copy kernels for KV exchange (docs/architecture.md: KV exchange) and peer gathers (TP local buffers).
// A "row" is one token's KV of one layer (e.g. 656 B FP8 MLA, 1152 B BF16). Rows are moved as 16-byte vectors
// (uint4), so row bytes and pool bases must be multiples of 16. Work is flattened over (row, vector): consecutive
// threads touch consecutive 16-B pieces of a row (coalesced), many rows per block, and each thread issues U
// independent loads before its first store so that enough bytes are in flight to cover PCIe / NVLink latency.
// Template VPR = vectors per row (0 = runtime value `vpr`), U = loads in flight per thread.
// No includes: NVRTC compiles this without a standard library.

template <int VPR>
__device__ __forceinline__ int vpr_of(int vpr) { return VPR > 0 ? VPR : vpr; }

// dst[dst_idx[r]] = src[src_idx[r]] for r < n. src/dst may be device, peer-device or mapped pinned host memory.
template <int VPR, int U>
__global__ void __launch_bounds__(256) gather_rows(uint4* __restrict__ dst, const uint4* __restrict__ src,
                                                   const long long* __restrict__ dst_idx,
                                                   const long long* __restrict__ src_idx, int n, int vpr_rt) {
  const int vpr = vpr_of<VPR>(vpr_rt);
  const long long total = (long long)n * vpr;
  const long long tile = (long long)blockDim.x * U;
  for (long long base = (long long)blockIdx.x * tile; base < total; base += (long long)gridDim.x * tile) {
    uint4 v[U];
    long long d[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      long long e = base + (long long)u * blockDim.x + threadIdx.x;
      d[u] = -1;
      if (e < total) {
        int r = (int)(e / vpr);
        int k = (int)(e - (long long)r * vpr);
        v[u] = src[src_idx[r] * vpr + k];
        d[u] = dst_idx[r] * vpr + k;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (d[u] >= 0) dst[d[u]] = v[u];
  }
}

// KV exchange with swap (docs/architecture.md): for each miss r, the incoming row moves from host slot h = host_idx[r] into
// GPU slot g = gpu_idx[r]; if victim[r] != 0 the row that g held moves out to host slot h (the slot the incoming
// entry vacated). Each (h, g) appears once per launch, so a thread's read-then-write of its own piece is race-free.
template <int VPR, int U>
__global__ void __launch_bounds__(256) exchange_rows(uint4* __restrict__ gpu, uint4* __restrict__ host,
                                                     const long long* __restrict__ gpu_idx,
                                                     const long long* __restrict__ host_idx,
                                                     const unsigned char* __restrict__ victim, int n, int vpr_rt) {
  const int vpr = vpr_of<VPR>(vpr_rt);
  const long long total = (long long)n * vpr;
  const long long tile = (long long)blockDim.x * U;
  for (long long base = (long long)blockIdx.x * tile; base < total; base += (long long)gridDim.x * tile) {
    uint4 in[U], out[U];
    long long g[U], h[U];
    bool sw[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      long long e = base + (long long)u * blockDim.x + threadIdx.x;
      g[u] = -1;
      sw[u] = false;
      if (e < total) {
        int r = (int)(e / vpr);
        int k = (int)(e - (long long)r * vpr);
        h[u] = host_idx[r] * vpr + k;
        g[u] = gpu_idx[r] * vpr + k;
        sw[u] = victim[r] != 0;
        in[u] = host[h[u]];
        if (sw[u]) out[u] = gpu[g[u]];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (g[u] >= 0) {
        gpu[g[u]] = in[u];
        if (sw[u]) host[h[u]] = out[u];
      }
    }
  }
}

// Line-window variant: reads, for each row, the whole 128-B lines that hold it (W vectors, W a multiple of 8),
// so every PCIe read request is a full line; the pieces outside the row are dropped. Needs the host pool padded
// by one line at its end. For rows whose size is a multiple of 128 B this equals exchange_rows.
template <int VPR, int U>
__global__ void __launch_bounds__(256) exchange_rows_lines(uint4* __restrict__ gpu, uint4* __restrict__ host,
                                                           const long long* __restrict__ gpu_idx,
                                                           const long long* __restrict__ host_idx,
                                                           const unsigned char* __restrict__ victim, int n) {
  constexpr int W = (VPR % 8 == 0) ? VPR : ((VPR + 14) / 8) * 8;
  const long long total = (long long)n * W;
  const long long tile = (long long)blockDim.x * U;
  for (long long base = (long long)blockIdx.x * tile; base < total; base += (long long)gridDim.x * tile) {
    uint4 in[U], out[U];
    long long g[U], h[U];
    bool use[U], sw[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      long long e = base + (long long)u * blockDim.x + threadIdx.x;
      use[u] = false;
      sw[u] = false;
      if (e < total) {
        int r = (int)(e / W);
        int j = (int)(e - (long long)r * W);
        long long row0 = host_idx[r] * VPR;
        long long src = (row0 & ~7LL) + j;
        int k = (int)(src - row0);
        in[u] = host[src];
        use[u] = (k >= 0 && k < VPR);
        if (use[u]) {
          h[u] = src;
          g[u] = gpu_idx[r] * VPR + k;
          sw[u] = victim[r] != 0;
          if (sw[u]) out[u] = gpu[g[u]];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (use[u]) {
        gpu[g[u]] = in[u];
        if (sw[u]) host[h[u]] = out[u];
      }
    }
  }
}

// Exchange of rank r's misses straight from the device-resident access batch (hw pipeline): rows
// [mbase[r], mbase[r+1]) of (dests, src places, victims); GPU slot = dest - g_off, host slot = src - h_off. The row
// count is read on the device, so the launch needs no host synchronisation (persistent grid, grid-stride).
template <int VPR, int U>
__global__ void __launch_bounds__(256) exchange_rows_dev(uint4* __restrict__ gpu, uint4* __restrict__ host,
                                                         const long long* __restrict__ dests,
                                                         const long long* __restrict__ src,
                                                         const long long* __restrict__ victims,
                                                         const long long* __restrict__ mbase, int r, long long g_off,
                                                         long long h_off, int vpr_rt) {
  const int vpr = vpr_of<VPR>(vpr_rt);
  const long long begin = mbase[r];
  const long long total = (mbase[r + 1] - begin) * vpr;
  const long long tile = (long long)blockDim.x * U;
  for (long long base = (long long)blockIdx.x * tile; base < total; base += (long long)gridDim.x * tile) {
    uint4 in[U], out[U];
    long long g[U], h[U];
    bool sw[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      long long e = base + (long long)u * blockDim.x + threadIdx.x;
      g[u] = -1;
      sw[u] = false;
      if (e < total) {
        long long i = e / vpr;
        int k = (int)(e - i * vpr);
        h[u] = (src[begin + i] - h_off) * vpr + k;
        g[u] = (dests[begin + i] - g_off) * vpr + k;
        sw[u] = victims[begin + i] >= 0;
        in[u] = host[h[u]];
        if (sw[u]) out[u] = gpu[g[u]];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (g[u] >= 0) {
        gpu[g[u]] = in[u];
        if (sw[u]) host[h[u]] = out[u];
      }
    }
  }
}

// Split exchange, phase 1 (HBM only): stage the victims' rows into a GPU scratch buffer (row i of the batch).
template <int VPR, int U>
__global__ void __launch_bounds__(256) stage_victims(const uint4* __restrict__ gpu, uint4* __restrict__ stage,
                                                     const long long* __restrict__ gpu_idx, int n, int vpr_rt) {
  const int vpr = vpr_of<VPR>(vpr_rt);
  const long long total = (long long)n * vpr;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
       e += (long long)gridDim.x * blockDim.x) {
    int r = (int)(e / vpr);
    int k = (int)(e - (long long)r * vpr);
    stage[e] = gpu[gpu_idx[r] * vpr + k];
  }
}

// ---- v3 gather through the bulk copy engine (Hopper cp.async.bulk): one request per row, global -> shared -> global.
// Each warp's lane 0 streams its rows through two shared-memory stages: load stage i+1 while stage i is written
// out. Rows must be 16-B aligned and a multiple of 16 B. Dynamic shared memory: warps * 2 * stage_bytes.
__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void bulk_load(void* dst_smem, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(smem_u32(dst_smem)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void bulk_store(void* dst, const void* src_smem, unsigned bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
               :: "l"(dst), "r"(smem_u32(src_smem)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned phase) {
  asm volatile("{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
               " @!p bra WAIT_%=;\n}" :: "r"(smem_u32(bar)), "r"(phase) : "memory");
}

extern "C" __global__ void __launch_bounds__(128) gather_rows_bulk(char* __restrict__ dst, const char* __restrict__ src,
                                                                   const long long* __restrict__ dst_idx,
                                                                   const long long* __restrict__ src_idx, int n,
                                                                   int row_bytes, int rows_per_stage) {
  extern __shared__ __align__(128) char smem[];
  __shared__ __align__(8) unsigned long long bars[4][2];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  const int stage_bytes = rows_per_stage * row_bytes;
  char* buf = smem + (size_t)warp * 2 * stage_bytes;
  if (lane == 0) {
    for (int s = 0; s < 2; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_u32(&bars[warp][s])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  if (lane != 0) return;
  const long long nbatch = (n + rows_per_stage - 1) / rows_per_stage;
  const long long first = (long long)blockIdx.x * nwarps + warp, stride = (long long)gridDim.x * nwarps;
  auto issue = [&](long long b, int s) {
    long long r0 = b * rows_per_stage;
    int cnt = (int)((n - r0) < rows_per_stage ? (n - r0) : rows_per_stage);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(smem_u32(&bars[warp][s])), "r"((unsigned)(cnt * row_bytes)) : "memory");
    for (int j = 0; j < cnt; ++j)
      bulk_load(buf + s * stage_bytes + j * row_bytes, src + src_idx[r0 + j] * row_bytes, row_bytes, &bars[warp][s]);
  };
  int it = 0;
  if (first < nbatch) issue(first, 0);
  for (long long b = first; b < nbatch; b += stride, ++it) {
    const int s = it & 1;
    long long nb = b + stride;
    if (nb < nbatch) {
      asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // stage s^1's previous stores have read smem
      issue(nb, s ^ 1);
    }
    mbar_wait(&bars[warp][s], (it >> 1) & 1);
    long long r0 = b * rows_per_stage;
    int cnt = (int)((n - r0) < rows_per_stage ? (n - r0) : rows_per_stage);
    for (int j = 0; j < cnt; ++j)
      bulk_store(dst + dst_idx[r0 + j] * row_bytes, buf + s * stage_bytes + j * row_bytes, row_bytes);
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
