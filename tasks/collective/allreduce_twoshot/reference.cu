// Reference: two-shot all-reduce (reduce-scatter, then all-gather) over peer pointers, in one kernel.
//
// The tensor is cut into `world` slices of whole 16-byte packs; rank p owns slice p.
//   1. reduce-scatter: rank r sums slice r of every rank's input (read straight from the peers' memory, in
//      float32, in rank order) and writes the result into slice r of its OWN output.
//   2. barrier: block b of rank r stores `epoch` into its own flag word of (round, b): "my part of slice r is in
//      my output"; block b of every peer polls that word (ld.acquire.sys) before it reads the part.
//   3. all-gather: rank r copies slice p, for every p != r, from rank p's output into its own, starting with its
//      right neighbour so that the ranks do not all read the same peer at once.
// Each rank moves 2 (world-1)/world times the tensor, the minimum for an all-reduce. No scratch is needed: the
// owners' outputs are the staging.
//
// Rounds. Each slice is walked in `rounds` consecutive parts; in round i, block b reduces its share of part i,
// signals, and gathers its share of part i-1 of the other slices, whose owners signalled a round earlier. So
//   - blocks never wait on the grid, only on block b of each peer, and normally not even that: the flag they need
//     was set a whole round before;
//   - a reduced part is read by the peers about one round after it was written (at world 2 in cuda-shared about
//     2 MiB of each slice per round, some 20 MiB of traffic on the GPU), so it should still be in the 50 MB L2.
//     At world 2 that takes the HBM traffic per rank from 2.5x to 2x the tensor (in: 1x, reduced slice: 0.5x,
//     gathered slice: 0.5x written), i.e. the bound from 80 % to 100 % of the cuda-shared copy roofline.
// Block b does the same part of every slice in both steps (pack offset o within a slice belongs to data thread
// o % (grid * kDataThreads), round o / round_packs), so what it gathers is exactly what block b of the owner
// reduced.
//
// Warp 0 of every block moves no data: it waits for the peers' flags of round i-1 while the 15 data warps reduce
// round i, then, after the block's barrier, signals round i. The data warps so never stall on a flag's round trip,
// and there is one __syncthreads per round.
//
// Memory ordering: the data warps write their packs, __syncthreads() orders those writes before thread 0, which
// issues a system-scope fence and then a release store (st.release.sys) of its own flag word. Lanes 0..world-1 of
// warp 0 poll the peers' words with acquire loads (ld.acquire.sys); the next __syncthreads() makes the data warps
// read the peers' outputs only after every flag was seen (L2-only loads, ld.global.cg: never a stale L1 line).
// Flags are never reset: `epoch` grows by one every call, so "flag >= epoch" means "set during this call".
// The judge synchronises every device before and after each call (of all ranks), so a peer's output is never
// overwritten (next call, or the judge's NaN fill) while this kernel still reads it.
//
// Residency: blocks spin, so all blocks of all ranks sharing a GPU must be resident at once. The grid is the
// blocks that fit (occupancy query, at most kBlocksPerSm per SM) divided by the ranks sharing the GPU: the whole
// GPU, not half of it, since nothing else runs during a call. Flag words: one per (round, block), in the owner's
// own flags (the peers poll it remotely; one store per signal instead of world - 1, and world times more rounds
// fit in the 4096 words), so the number of rounds is at most flag_words / grid. Every rank computes the same
// grid, slices and rounds from the same count, world and device, and every block signals every round, data or
// not, so every flag waited for is set in the same call.
#include "commbench.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

namespace {

constexpr int kDataWarps = 15;
constexpr int kDataThreads = 32 * kDataWarps;  // threads per block that move data
constexpr int kThreads = kDataThreads + 32;    // plus warp 0, which only waits and signals
constexpr int kBlocksPerSm = 2;                // resident blocks per SM we count on (registers <= 64 allow 2)

template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// A pack: N elements moved as one access. kVector: 16 bytes (a uint4, N = 16 / sizeof(T)), whose 32-bit words
// are unpacked to float32 by hand (a struct of 8 bf16 would take a register per element); otherwise one element.
// Cache hints: inputs are read once (ld.global.cs, evict first), the peers' reduced slices are read from the L2
// (ld.global.cg: never a stale L1 line), gathered packs are never read again here (st.global.cs), so the L2 keeps
// the freshly reduced parts that the peers are about to read.
template <typename T, bool kVector> struct Packs;

template <typename T> struct Packs<T, true> {
  using Raw = uint4;
  static constexpr int N = 16 / sizeof(T);
  static __device__ __forceinline__ Raw ld_input(const Raw* p) { return __ldcs(p); }
  static __device__ __forceinline__ Raw ld_reduced(const Raw* p) { return __ldcg(p); }
  static __device__ __forceinline__ void st_gathered(Raw* p, const Raw& v) { __stcs(p, v); }
  // acc (+)= the pack's elements, in element order
  static __device__ __forceinline__ void add(float (&acc)[N], const Raw& v, bool init) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (sizeof(T) == 4) {
        const float x = __uint_as_float(w[i]);
        acc[i] = init ? x : acc[i] + x;
      } else {
        float2 x;
        if constexpr (std::is_same<T, __nv_bfloat16>::value) {
          // a bf16 is the top half of a float32
          x = make_float2(__uint_as_float(w[i] << 16), __uint_as_float(w[i] & 0xFFFF0000u));
        } else {
          __half2 h;
          memcpy(&h, &w[i], 4);
          x = __half22float2(h);
        }
        acc[2 * i] = init ? x.x : acc[2 * i] + x.x;
        acc[2 * i + 1] = init ? x.y : acc[2 * i + 1] + x.y;
      }
    }
  }
  static __device__ __forceinline__ Raw round(const float (&acc)[N]) {  // to T, round to nearest even
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (sizeof(T) == 4) {
        w[i] = __float_as_uint(acc[i]);
      } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
        memcpy(&w[i], &h, 4);
      } else {
        const __half2 h = __floats2half2_rn(acc[2 * i], acc[2 * i + 1]);
        memcpy(&w[i], &h, 4);
      }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
};

template <typename T> struct Packs<T, false> {
  using Raw = T;
  static constexpr int N = 1;
  static __device__ __forceinline__ Raw ld_input(const Raw* p) { return *p; }
  static __device__ __forceinline__ Raw ld_reduced(const Raw* p) { return __ldcg(p); }
  static __device__ __forceinline__ void st_gathered(Raw* p, const Raw& v) { *p = v; }
  static __device__ __forceinline__ void add(float (&acc)[1], const Raw& v, bool init) {
    acc[0] = init ? to_float(v) : acc[0] + to_float(v);
  }
  static __device__ __forceinline__ Raw round(const float (&acc)[1]) { return from_float<T>(acc[0]); }
};

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

struct TwoShotArgs {
  const void* in[CB_MAX_RANKS];   // every rank's input
  const void* out[CB_MAX_RANKS];  // every rank's output (slice p of rank p's is read in step 3)
  uint32_t* flags[CB_MAX_RANKS];  // every rank's flag words: word i * grid + b is set by its block b in round i
  int64_t n;                      // elements
  int64_t whole_packs;            // packs of N elements that lie wholly in the tensor (n / N)
  int64_t slice_packs;            // packs per slice (ceil(ceil(n / N) / world)): the last pack may be partial
  int64_t round_packs;            // packs of a slice per round: a multiple of the grid's data threads
  int rounds;
  // The partial last pack (pack whole_packs, when N does not divide n): its slice, round and data thread
  // (slice -1: there is none).
  int tail_slice;
  int tail_round;
  int64_t tail_thread;
  int rank;
  int world;
  uint32_t epoch;
};

// The partial last pack of the tensor (when N does not divide the count), element by element. It belongs to
// one data thread in one round, like any pack (TwoShotArgs::tail_*); kept out of line so the hot loops stay small.
template <typename T>
__device__ __noinline__ void reduce_tail(const void* const* in, int world, int64_t x0, int64_t n, T* out) {
  for (int64_t x = x0; x < n; ++x) {
    float acc = to_float(static_cast<const T*>(in[0])[x]);  // float32, rank order, as for whole packs
    for (int p = 1; p < world; ++p) acc += to_float(static_cast<const T*>(in[p])[x]);
    out[x] = from_float<T>(acc);
  }
}

template <typename T>
__device__ __noinline__ void copy_tail(const T* src, int64_t x0, int64_t n, T* out) {
  for (int64_t x = x0; x < n; ++x) out[x] = __ldcg(src + x);
}

// Loads in flight per data thread: U packs per step, and at most kGroup ranks (or peers) of each at once, which
// keeps world 8 within the 64 registers that two blocks per SM allow (8 x 16-byte loads plus their addresses and
// the float32 sums spilled).
constexpr int kGroup = 4;
template <int W> constexpr int kPacksPerStep = W <= 2 ? 2 : 1;

// Step 1 for round i: this data thread's whole packs of part i of slice `rank`, summed in float32 in rank order.
// W >= world bounds the register arrays.
template <typename T, bool V, int W>
__device__ __forceinline__ void reduce_round(const TwoShotArgs& a, T* out, int64_t first, int64_t stride, int i) {
  using K = Packs<T, V>;
  using Raw = typename K::Raw;
  constexpr int U = kPacksPerStep<W>;
  constexpr int G = W < kGroup ? W : kGroup;
  const int64_t s0 = min(a.rank * a.slice_packs, a.whole_packs);
  const int64_t s1 = min(s0 + a.slice_packs, a.whole_packs);
  const int64_t lo = s0 + i * a.round_packs;
  const int64_t hi = min(lo + a.round_packs, s1);
#pragma unroll 1  // a step is unrolled already; more would only cost registers
  for (int64_t k = lo + first; k < hi; k += U * stride) {
    float acc[U][K::N];
#pragma unroll
    for (int p0 = 0; p0 < W; p0 += G) {
      if (p0 >= a.world) break;
      Raw v[U][G];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int g = 0; g < G; ++g)
          if (k + u * stride < hi && p0 + g < a.world)
            v[u][g] = K::ld_input(static_cast<const Raw*>(a.in[p0 + g]) + k + u * stride);
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int g = 0; g < G; ++g)
          if (p0 + g < a.world) K::add(acc[u], v[u][g], p0 + g == 0);  // rank 0 first, then 1, 2, ...
    }
#pragma unroll
    for (int u = 0; u < U; ++u)  // default caching: the peers read it back within a round
      if (k + u * stride < hi) reinterpret_cast<Raw*>(out)[k + u * stride] = K::round(acc[u]);
  }
  if (i == a.tail_round && first == a.tail_thread && a.rank == a.tail_slice)
    reduce_tail<T>(a.in, a.world, a.whole_packs * K::N, a.n, out);
}

// Step 3 for round i: this data thread's whole packs of part i of every other slice, copied from their owners'
// outputs, the right neighbour's first.
template <typename T, bool V, int W>
__device__ __forceinline__ void gather_round(const TwoShotArgs& a, T* out, int64_t first, int64_t stride, int i) {
  using K = Packs<T, V>;
  using Raw = typename K::Raw;
  constexpr int U = kPacksPerStep<W>;
  constexpr int G = W - 1 < 1 ? 1 : (W - 1 < kGroup ? W - 1 : kGroup);
  const int64_t lo = i * a.round_packs;  // offsets within a slice
  const int64_t hi = min(lo + a.round_packs, a.slice_packs);
#pragma unroll 1
  for (int64_t o = lo + first; o < hi; o += U * stride) {
#pragma unroll
    for (int j0 = 1; j0 < W; j0 += G) {
      if (j0 >= a.world) break;
      Raw v[U][G];
      int64_t at[U][G];  // pack index in the tensor, or -1
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const int j = j0 + g;
          const int p = a.rank + j < a.world ? a.rank + j : a.rank + j - a.world;
          const int64_t kk = p * a.slice_packs + o + u * stride;
          at[u][g] = j < a.world && o + u * stride < hi && kk < a.whole_packs ? kk : -1;
          if (at[u][g] >= 0) v[u][g] = K::ld_reduced(static_cast<const Raw*>(a.out[p]) + kk);
        }
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int g = 0; g < G; ++g)
          if (at[u][g] >= 0) K::st_gathered(reinterpret_cast<Raw*>(out) + at[u][g], v[u][g]);
    }
  }
  if (i == a.tail_round && first == a.tail_thread && a.rank != a.tail_slice)
    copy_tail<T>(static_cast<const T*>(a.out[a.tail_slice]), a.whole_packs * K::N, a.n, out);
}

// Warp 0, after the barrier of round i: thread 0 publishes "block b's part of round i is in my output".
__device__ __forceinline__ void signal_round(const TwoShotArgs& a, int i) {
  if (threadIdx.x == 0) {
    __threadfence_system();
    st_release_sys(a.flags[a.rank] + static_cast<int64_t>(i) * gridDim.x + blockIdx.x, a.epoch);
  }
}

// Warp 0, before the barrier of round i + 1: lane t waits until block b of peer t has published round i.
__device__ __forceinline__ void wait_round(const TwoShotArgs& a, int i) {
  const int t = threadIdx.x;
  if (t < a.world && t != a.rank) {
    const uint32_t* f = a.flags[t] + static_cast<int64_t>(i) * gridDim.x + blockIdx.x;
    while (static_cast<int32_t>(ld_acquire_sys(f) - a.epoch) < 0) {
    }
  }
}

template <typename T, bool V, int W>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) twoshot_kernel(const __grid_constant__ TwoShotArgs a) {
  T* out = static_cast<T*>(const_cast<void*>(a.out[a.rank]));
  const bool sync_warp = threadIdx.x < 32;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kDataThreads + (static_cast<int>(threadIdx.x) - 32);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kDataThreads;
  // Round i: reduce part i | barrier | signal part i, gather part i-1. Iteration `rounds` only drains.
#pragma unroll 1
  for (int i = 0; i <= a.rounds; ++i) {
    if (sync_warp) {
      if (i > 0) wait_round(a, i - 1);
    } else if (i < a.rounds) {
      reduce_round<T, V, W>(a, out, first, stride, i);
    }
    __syncthreads();
    if (sync_warp) {
      if (i < a.rounds) signal_round(a, i);
    } else if (i > 0) {
      gather_round<T, V, W>(a, out, first, stride, i - 1);
    }
  }
}

// Ranks that share this rank's GPU. The judge puts either every rank on one GPU (cuda-shared) or one rank on
// each GPU (cuda), so the right neighbour tells which; every rank computes the same answer.
int ranks_per_gpu(const cb_args* a) {
  if (a->world < 2) return 1;
  cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, a->peer_flags[(a->rank + 1) % a->world]) != cudaSuccess) {
    (void)cudaGetLastError();
    return a->world;  // unknown: assume the worst
  }
  return at.device == a->device ? a->world : 1;
}

int64_t ceil_div(int64_t x, int64_t y) { return (x + y - 1) / y; }

template <typename T, bool V, int W>
int launch_kernel(const cb_args* a, TwoShotArgs& k, cudaStream_t stream) {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, a->device) != cudaSuccess || sms < 1) return 2;
  // Blocks of this kernel that fit on one SM (every rank launches the same kernel: the same answer everywhere).
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, twoshot_kernel<T, V, W>, kThreads, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    per_sm = 1;
  }
  per_sm = per_sm < 1 ? 1 : (per_sm > kBlocksPerSm ? kBlocksPerSm : per_sm);
  // Every spinning block of every rank sharing this GPU must be resident at once: split what fits between them.
  int64_t grid = ceil_div(k.slice_packs, kDataThreads);
  const int64_t resident = static_cast<int64_t>(sms) * per_sm / ranks_per_gpu(a);
  if (grid > resident) grid = resident;
  if (grid > a->flag_words) grid = a->flag_words;  // at least one round's flag words
  if (grid < 1) {
    if (a->flag_words < 1) return 5;  // not enough flag words for even one block
    grid = 1;
  }
  // Rounds: one step of kPacksPerStep packs per data thread and round: at world <= 2 two packs (about 2 MiB of a
  // slice per round on an H200 in cuda-shared, so a reduced part is still in the L2 when the peer gathers it), at
  // larger worlds one (each round also moves about world times more bytes). More packs per round only where the
  // flag words run out. (The knob to try on a GPU: larger rounds mean fewer barriers but less L2 reuse.)
  const int64_t stride = grid * kDataThreads;
  const int64_t max_rounds = a->flag_words / grid;
  int64_t per_thread = kPacksPerStep<W>;
  const int64_t needed = ceil_div(k.slice_packs, max_rounds * stride);
  if (per_thread < needed) per_thread = needed;
  k.round_packs = per_thread * stride;
  k.rounds = static_cast<int>(ceil_div(k.slice_packs, k.round_packs));
  k.tail_slice = k.tail_round = -1;
  k.tail_thread = -1;
  if (k.whole_packs * Packs<T, V>::N < k.n) {  // pack whole_packs is partial: the thread it falls to does it
    const int64_t o = k.whole_packs % k.slice_packs;
    k.tail_slice = static_cast<int>(k.whole_packs / k.slice_packs);
    k.tail_round = static_cast<int>(o / k.round_packs);
    k.tail_thread = o % stride;
  }
  twoshot_kernel<T, V, W><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(k);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}

template <typename T>
int launch(const cb_args* a, cudaStream_t stream) {
  TwoShotArgs k{};
  // Every rank sees the same peer pointers, so every rank picks the same pack width, slices and grid.
  bool aligned = true;
  for (int p = 0; p < a->world; ++p) {
    k.in[p] = a->peer_in[p];
    k.out[p] = a->peer_out[p];
    k.flags[p] = a->peer_flags[p];
    aligned = aligned && ((reinterpret_cast<uintptr_t>(a->peer_in[p]) | reinterpret_cast<uintptr_t>(a->peer_out[p])) & 15) == 0;
  }
  const int vec = aligned ? Packs<T, true>::N : 1;
  k.n = a->count;
  k.rank = a->rank;
  k.world = a->world;
  k.epoch = a->epoch;
  k.whole_packs = a->count / vec;
  k.slice_packs = ceil_div(ceil_div(a->count, vec), a->world);
  if (!aligned) return launch_kernel<T, false, CB_MAX_RANKS>(a, k, stream);  // element by element, any world
  if (a->world <= 2) return launch_kernel<T, true, 2>(a, k, stream);
  if (a->world <= 4) return launch_kernel<T, true, 4>(a, k, stream);
  return launch_kernel<T, true, CB_MAX_RANKS>(a, k, stream);
}

}  // namespace

CB_ENTRY all_reduce(const cb_args* args, cudaStream_t stream) {
  if (args->count <= 0) return 0;  // every rank returns: nobody waits
  if (args->world < 1 || args->world > CB_MAX_RANKS) return 1;
  switch (args->dtype) {
    case CB_FLOAT32: return launch<float>(args, stream);
    case CB_FLOAT16: return launch<__half>(args, stream);
    case CB_BFLOAT16: return launch<__nv_bfloat16>(args, stream);
    default: return 1;
  }
}
