// Reference: broadcast through the root's scratch, chunk by chunk, with one completion flag per chunk.
//
// The tensor is handled as bytes (the dtype does not matter to a copy), cut into G chunks of `chunk` bytes (a
// multiple of 16; the last one may be partial), G <= flag_words.
//   - Root: block b of the root copies chunks b, b + grid_root, ... of its input into its own `out` and into its
//     own `scratch` (the staging copy), then stores `epoch` into word c of every reader's flags: "chunk c is
//     staged". The root never waits.
//   - Reader: block b of a reader takes chunks b, b + grid_reader, ... in order; for each, thread 0 polls its OWN
//     flag word c (local memory: the root wrote it remotely) until it reads `epoch`, then the block copies chunk
//     c from the root's scratch into its own `out`. Readers trail the root by about a chunk, so in cuda-shared
//     they mostly read the staged bytes back from the L2.
// Flags are never reset: `epoch` grows by one every call, so `(int32_t)(flag - epoch) >= 0` means "set during
// this call" (a flag left from an earlier call is smaller).
//
// Memory ordering: the root's copying threads store their bytes, `__syncthreads()` orders those stores before
// lanes 0..world-1, each of which issues `__threadfence_system()` and a release store (st.release.sys) of chunk
// c's flag word in one reader's flags. Thread 0 of a reader polls with acquire loads (ld.acquire.sys), then a
// `__syncthreads()` lets the block read the chunk, with L2-only loads (ld.global.cg): scratch is rewritten every
// call and an L1 line from an earlier call must never be used.
//
// Residency (cuda-shared): readers spin, so every reader block must be able to wait while the root's blocks run.
// The GPU's resident blocks (SMs x blocks per SM, from the occupancy query) are split in world + 1 shares: each
// reader gets one, the root two (it moves 3 bytes per byte of data, a reader 2), so all blocks of all ranks are
// resident together. In device mode `cuda` every rank has its GPU to itself.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 512;
constexpr int kBlocksPerSm = 2;
constexpr int kUnroll = 4;  // 16-byte packs per thread in flight

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

struct BcastArgs {
  const uint8_t* src;              // root: its input; reader: the root's scratch
  uint8_t* dst0;                   // this rank's out
  uint8_t* dst1;                   // root: its own scratch (the staging copy); reader: NULL
  uint32_t* reader_flags[CB_MAX_RANKS];  // root: every reader's flags (NULL for the root itself)
  uint32_t* my_flags;              // reader: its own flags
  int64_t nbytes;
  int64_t chunk;                   // bytes per chunk, a multiple of 16
  int64_t chunks;
  int world;
  uint32_t epoch;
};

// Copies bytes [lo, hi) of src to dst0 (and dst1 when not NULL). kVec: 16-byte packs (every pointer 16-byte
// aligned and lo a multiple of 16), then the partial tail byte by byte.
template <bool kVec, bool kCg>
__device__ __forceinline__ void copy_range(const BcastArgs& a, int64_t lo, int64_t hi) {
  int64_t b = lo;
  if constexpr (kVec) {
    const int64_t packs = (hi - lo) / 16;
    const uint4* s = reinterpret_cast<const uint4*>(a.src + lo);
    uint4* d0 = reinterpret_cast<uint4*>(a.dst0 + lo);
    uint4* d1 = a.dst1 ? reinterpret_cast<uint4*>(a.dst1 + lo) : nullptr;
    const int64_t t = threadIdx.x;
    const int64_t step = static_cast<int64_t>(kThreads) * kUnroll;
    int64_t k = t;
    for (; k + (kUnroll - 1) * kThreads < packs; k += step) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = kCg ? __ldcg(s + k + u * kThreads) : __ldcs(s + k + u * kThreads);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        __stcs(d0 + k + u * kThreads, v[u]);
        if (d1) d1[k + u * kThreads] = v[u];  // default caching: the readers read it back soon
      }
    }
    for (; k < packs; k += kThreads) {
      const uint4 v = kCg ? __ldcg(s + k) : __ldcs(s + k);
      __stcs(d0 + k, v);
      if (d1) d1[k] = v;
    }
    b = lo + packs * 16;
  }
  for (int64_t i = b + threadIdx.x; i < hi; i += kThreads) {
    const uint8_t v = kCg ? __ldcg(a.src + i) : a.src[i];
    a.dst0[i] = v;
    if (a.dst1) a.dst1[i] = v;
  }
}

template <bool kVec>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) root_kernel(const __grid_constant__ BcastArgs a) {
  for (int64_t c = blockIdx.x; c < a.chunks; c += gridDim.x) {
    const int64_t lo = c * a.chunk;
    const int64_t hi = min(lo + a.chunk, a.nbytes);
    copy_range<kVec, false>(a, lo, hi);
    __syncthreads();  // every byte of chunk c is stored before any flag of chunk c
    const int t = threadIdx.x;
    if (t < a.world && a.reader_flags[t] != nullptr) {
      __threadfence_system();
      st_release_sys(a.reader_flags[t] + c, a.epoch);
    }
  }
}

template <bool kVec>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) reader_kernel(const __grid_constant__ BcastArgs a) {
  for (int64_t c = blockIdx.x; c < a.chunks; c += gridDim.x) {
    if (threadIdx.x == 0) {
      while (static_cast<int32_t>(ld_acquire_sys(a.my_flags + c) - a.epoch) < 0) {
      }
    }
    __syncthreads();  // nobody reads chunk c before its flag was seen
    const int64_t lo = c * a.chunk;
    copy_range<kVec, true>(a, lo, min(lo + a.chunk, a.nbytes));
  }
}

int elem_bytes(int dtype) {
  switch (dtype) {
    case CB_FLOAT32: case CB_INT32: return 4;
    case CB_FLOAT16: case CB_BFLOAT16: return 2;
    case CB_FLOAT64: case CB_INT64: return 8;
    case CB_UINT8: return 1;
    default: return 0;
  }
}

// Ranks that share this rank's GPU: all (cuda-shared) or one (cuda); every rank finds the same answer.
int ranks_per_gpu(const cb_args* a) {
  if (a->world < 2) return 1;
  cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, a->peer_flags[(a->rank + 1) % a->world]) != cudaSuccess) {
    (void)cudaGetLastError();
    return a->world;  // unknown: assume the worst
  }
  return at.device == a->device ? a->world : 1;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

int64_t ceil_div(int64_t x, int64_t y) { return (x + y - 1) / y; }

template <typename K>
int blocks_per_sm(K kernel) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    per_sm = 1;
  }
  return per_sm < 1 ? 1 : (per_sm > kBlocksPerSm ? kBlocksPerSm : per_sm);
}

}  // namespace

CB_ENTRY broadcast(const cb_args* args, cudaStream_t stream) {
  const int world = args->world;
  if (world < 1 || world > CB_MAX_RANKS) return 1;
  int root = static_cast<int>(args->params[0]);
  if (root < 0) root += world;
  if (root < 0 || root >= world) return 1;
  const int esz = elem_bytes(args->dtype);
  if (esz == 0) return 1;
  const int64_t nbytes = args->count * esz;
  if (nbytes <= 0) return 0;  // nobody waits for anything
  const bool is_root = args->rank == root;
  if (world > 1 && (args->peer_scratch[root] == nullptr || nbytes > args->scratch_bytes)) return 4;

  // Chunks: at least 64 KiB (fewer flags and barriers), at most flag_words of them; the same on every rank.
  int64_t chunk = 64 * 1024;
  if (ceil_div(nbytes, chunk) > args->flag_words) chunk = ceil_div(ceil_div(nbytes, args->flag_words), 16) * 16;
  const int64_t chunks = ceil_div(nbytes, chunk);

  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess || sms < 1) return 2;
  const int shared = ranks_per_gpu(args);

  BcastArgs k{};
  k.nbytes = nbytes;
  k.chunk = chunk;
  k.chunks = chunks;
  k.world = world;
  k.epoch = args->epoch;
  k.dst0 = static_cast<uint8_t*>(args->out);
  if (is_root) {
    k.src = static_cast<const uint8_t*>(args->in);
    k.dst1 = world > 1 ? static_cast<uint8_t*>(args->scratch) : nullptr;
    for (int p = 0; p < world; ++p) k.reader_flags[p] = p == root ? nullptr : args->peer_flags[p];
  } else {
    k.src = static_cast<const uint8_t*>(args->peer_scratch[root]);
    k.dst1 = nullptr;
    k.my_flags = args->flags;
  }
  const bool vec = aligned16(k.src) && aligned16(k.dst0) && (k.dst1 == nullptr || aligned16(k.dst1));

  // Resident blocks of the GPU, split in world + 1 shares when the ranks share it: the root gets two.
  const int per_sm = is_root ? blocks_per_sm(vec ? root_kernel<true> : root_kernel<false>)
                             : blocks_per_sm(vec ? reader_kernel<true> : reader_kernel<false>);
  int64_t grid;
  if (shared > 1) {
    const int64_t share = static_cast<int64_t>(sms) * per_sm / (shared + 1);
    grid = is_root ? 2 * share : share;
  } else {
    grid = static_cast<int64_t>(sms) * per_sm;
  }
  if (grid > chunks) grid = chunks;
  if (grid < 1) grid = 1;
  const unsigned g = static_cast<unsigned>(grid);
  if (is_root) {
    if (vec) root_kernel<true><<<g, kThreads, 0, stream>>>(k);
    else root_kernel<false><<<g, kThreads, 0, stream>>>(k);
  } else {
    if (vec) reader_kernel<true><<<g, kThreads, 0, stream>>>(k);
    else reader_kernel<false><<<g, kThreads, 0, stream>>>(k);
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
