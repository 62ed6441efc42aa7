// Reference: hierarchical (two-level) all-reduce over peer pointers that reach only a rank's own group and its
// counterparts in the other groups, in one kernel.
//
// Ranks: g = args->params[0] consecutive ranks per group, G = world / g groups; rank r is (k, l) with group
// k = r / g and local index l = r % g. Rank (k, l) reaches the ranks (k, *) of its group and its counterparts
// (*, l). The tensor is cut into world chunks of whole 16-byte packs; chunk c = l * G + j is "part j of slice l",
// owned by rank (j, l). Slice l (chunks l * G .. l * G + G - 1) is what the ranks of local index l reduce.
//   S1 intra-group reduce-scatter: rank (k, l) sums slice l of the inputs of its group (k, 0 .. g-1) and stores
//      the partial sum P_k in slice l of its OWN output (no scratch).
//   S2 inter-group reduce-scatter: rank (k, l) sums chunk (l, k) of P over its counterparts (0 .. G-1, l), read
//      from their outputs, and stores the total in chunk (l, k) of its output.
//   S3 inter-group all-gather: rank (k, l) copies chunk (l, j) of every counterpart (j, l), j != k, into its
//      output: slice l of its output is now final (and overwrites the P it held there).
//   S4 intra-group all-gather: rank (k, l) copies slice l' of every group member (k, l'), l' != l.
// Per rank, S1 reads the tensor once from the group (g - 1 of g slices over intra-group links) and S2 + S3 move
// 2 (G - 1) / G of a slice, S / g, over the inter-group links: the minimum for a schedule that crosses groups only
// between counterparts; S4 moves (g - 1) / g of the tensor over the intra-group links. Degenerate groups skip a
// level: g == 1 (every rank its own group) reads the counterparts' inputs in S2 directly (no S1, no S4: the flat
// two-shot); G == 1 (one group) makes S1's sums the totals (no S2, no S3).
//
// Write-after-read: the P of chunk (l, j) in rank (k, l)'s output is read by counterpart (j, l) in its S2 and
// overwritten by rank (k, l)'s own S3, which waits for exactly that counterpart's "S2 done" flag first.
//
// Rounds: each chunk is walked in `rounds` consecutive parts; part i of every stage is done by the same data thread
// of block b on every rank (pack offset o within a chunk belongs to data thread o % stride of round o / round_packs),
// so block b waits only for block b of its peers. Iteration t does S1(t) | barrier | S2(t-1), S3(t-2), S4(t-3): each
// stage uses what its peers published in an earlier iteration, so blocks normally do not stall, and a part is read
// back a round or two after it was written, while it is still in the L2 (the output lines P -> total -> read are
// written back to HBM about once). Warp 0 of every block moves no data: it publishes and waits while the 15 data
// warps work.
//
// Flags: three words per (round, block) in the owner's own flags, F1 "S1(i) done", F2 "S2(i) done", F3 "S3(i) done
// (slice l of my output is final for round i)", set to `epoch` and polled by the peers (ld.acquire.sys) until
// (int32)(flag - epoch) >= 0: never reset, and a word left from an earlier call never looks fresh. Publishing: the
// data warps' writes, __syncthreads(), thread 0 __threadfence_system() + st.release.sys. Consuming: acquire poll,
// __syncthreads(), loads of peer-written data with ld.global.cg (never a stale L1 line). Every block of every rank
// runs the same iterations and publishes every round, data or not, so every flag waited for is set in the same call;
// the waits of iteration t need only signals that peers make before their own waits of iteration t (no deadlock).
//
// Residency: blocks spin, so all blocks of all ranks sharing a GPU must be resident together: the grid is the blocks
// that fit (occupancy, at most kBlocksPerSm per SM) divided by the ranks sharing the GPU, the same on every rank.
// The layout (packs of 16 bytes, chunks, rounds, grid) depends only on count, world, g and the device, never on the
// pointers, so every rank computes the same one; unaligned buffers (never given by the judge) only switch the
// accesses to element-wide ones over the same layout.
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
constexpr int kThreads = kDataThreads + 32;    // plus warp 0, which only publishes and waits
constexpr int kBlocksPerSm = 2;                // resident blocks per SM we count on (registers <= 64 allow 2)
constexpr int kMaxW = CB_MAX_RANKS;

template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// A pack: the N = 16 / sizeof(T) elements of one 16-byte unit of the layout. kVector: moved as one uint4 whose
// 32-bit words are unpacked to float32 by hand; otherwise element by element (the same layout, for buffers that
// are not 16-byte aligned). Loads: inputs ld.global.cs (read once, evict first), data peers wrote ld.global.cg.
template <typename T, bool kVector> struct Packs;

template <typename T> struct Packs<T, true> {
  using Raw = uint4;
  static constexpr int N = 16 / sizeof(T);
  static __device__ __forceinline__ Raw ld_input(const T* b, int64_t k) { return __ldcs(reinterpret_cast<const uint4*>(b) + k); }
  static __device__ __forceinline__ Raw ld_peer(const T* b, int64_t k) { return __ldcg(reinterpret_cast<const uint4*>(b) + k); }
  static __device__ __forceinline__ void st(T* b, int64_t k, const Raw& v) { reinterpret_cast<uint4*>(b)[k] = v; }
  static __device__ __forceinline__ void st_last(T* b, int64_t k, const Raw& v) { __stcs(reinterpret_cast<uint4*>(b) + k, v); }
  // acc (+)= the pack's elements
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
          x = make_float2(__uint_as_float(w[i] << 16), __uint_as_float(w[i] & 0xFFFF0000u));  // bf16 = top of f32
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
  static constexpr int N = 16 / sizeof(T);
  struct Raw {
    T v[N];
  };
  static __device__ __forceinline__ Raw ld_input(const T* b, int64_t k) {
    Raw r;
#pragma unroll
    for (int e = 0; e < N; ++e) r.v[e] = b[k * N + e];
    return r;
  }
  static __device__ __forceinline__ Raw ld_peer(const T* b, int64_t k) {
    Raw r;
#pragma unroll
    for (int e = 0; e < N; ++e) r.v[e] = __ldcg(b + k * N + e);
    return r;
  }
  static __device__ __forceinline__ void st(T* b, int64_t k, const Raw& v) {
#pragma unroll
    for (int e = 0; e < N; ++e) b[k * N + e] = v.v[e];
  }
  static __device__ __forceinline__ void st_last(T* b, int64_t k, const Raw& v) { st(b, k, v); }
  static __device__ __forceinline__ void add(float (&acc)[N], const Raw& v, bool init) {
#pragma unroll
    for (int e = 0; e < N; ++e) acc[e] = init ? to_float(v.v[e]) : acc[e] + to_float(v.v[e]);
  }
  static __device__ __forceinline__ Raw round(const float (&acc)[N]) {
    Raw r;
#pragma unroll
    for (int e = 0; e < N; ++e) r.v[e] = from_float<T>(acc[e]);
    return r;
  }
};

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

enum Stage { kF1 = 0, kF2 = 1, kF3 = 2 };  // flag words per (round, block): S1 done, S2 done, S3 done

struct TwoLevelArgs {
  const void* in[kMaxW];   // inputs of this rank's group (NULL elsewhere; all counterparts' too when g == 1)
  const void* out[kMaxW];  // outputs of the group and the counterparts
  uint32_t* flags[kMaxW];  // flags of the group and the counterparts: word (i * 3 + stage) * grid + b
  int64_t n;               // elements
  int64_t whole_packs;     // packs of N elements that lie wholly in the tensor (n / N)
  int chunk_packs;         // packs per chunk (ceil(ceil(n / N) / world)): the last pack may be partial
  int round_packs;         // packs of a chunk per round: a multiple of the grid's data threads
  int rounds;
  // The partial last pack (pack whole_packs, when N does not divide n): its chunk, round and data thread
  // (chunk -1: there is none).
  int tail_chunk;
  int tail_round;
  int tail_thread;
  int rank, world;
  int g, G;  // ranks per group, groups
  int k, l;  // this rank's group and local index
  uint32_t epoch;
};

__device__ __forceinline__ int64_t word(int i, int stage) {
  return (static_cast<int64_t>(i) * 3 + stage) * gridDim.x + blockIdx.x;
}

// Loads in flight per data thread: U packs per step and at most kGroup sources of each at once (<= 4 16-byte
// loads), which keeps a step within the 64 registers that two blocks of 512 threads per SM allow.
template <int U> constexpr int kGroup = 4 / U;

// out[base + o] = sum over the ns sources s (in order) of src(s)[base + o], for this data thread's whole packs of
// [lo, hi) within the chunk starting at pack `base`. kInput: the sources are inputs (streamed, read once). Offsets
// within a chunk are 32-bit (the launch checks that they fit), addresses are formed per access.
template <typename T, bool V, int U, bool kInput, typename Src>
__device__ __forceinline__ void reduce_part(Src src, int ns, T* out, int64_t base, int lo, int hi, int first,
                                            int stride, int64_t whole) {
  using K = Packs<T, V>;
  using Raw = typename K::Raw;
  constexpr int Gq = kGroup<U>;
  const int lim = static_cast<int>(min(static_cast<int64_t>(hi), max(whole - base, static_cast<int64_t>(0))));
  T* dst = out + base * K::N;
#pragma unroll 1
  for (int o = lo + first; o < lim; o += U * stride) {
    float acc[U][K::N];
#pragma unroll
    for (int s0 = 0; s0 < kMaxW; s0 += Gq) {
      if (s0 >= ns) break;
      Raw v[U][Gq];
#pragma unroll
      for (int q = 0; q < Gq; ++q)
        if (s0 + q < ns) {
          const T* p = src(s0 + q) + base * K::N;
#pragma unroll
          for (int u = 0; u < U; ++u)
            if (u == 0 || o + u * stride < lim) v[u][q] = kInput ? K::ld_input(p, o + u * stride) : K::ld_peer(p, o + u * stride);
        }
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int q = 0; q < Gq; ++q)
          if ((u == 0 || o + u * stride < lim) && s0 + q < ns) K::add(acc[u], v[u][q], s0 + q == 0);  // source 0 first
    }
#pragma unroll
    for (int u = 0; u < U; ++u)  // default caching: peers read it back within a round or two
      if (u == 0 || o + u * stride < lim) K::st(dst, o + u * stride, K::round(acc[u]));
  }
}

// For each of the ni items q (a source pointer and the first pack of a chunk, from item(q, src, base)), copy this
// data thread's whole packs of [lo, hi) of that chunk from the source into `out`. kLast: nobody reads them again.
template <typename T, bool V, int U, bool kLast, typename Item>
__device__ __forceinline__ void copy_parts(Item item, int ni, T* out, int lo, int hi, int first, int stride,
                                           int64_t whole) {
  using K = Packs<T, V>;
  using Raw = typename K::Raw;
  constexpr int Gq = kGroup<U>;
#pragma unroll 1
  for (int o = lo + first; o < hi; o += U * stride) {
#pragma unroll
    for (int q0 = 0; q0 < kMaxW; q0 += Gq) {
      if (q0 >= ni) break;
      Raw v[U][Gq];
      T* dst[Gq];
      int lim[Gq];  // packs of the chunk below min(hi, the tensor's whole packs); 0 for no item
#pragma unroll
      for (int q = 0; q < Gq; ++q) {
        const T* src = nullptr;
        int64_t base = 0;
        lim[q] = 0;
        dst[q] = out;
        if (q0 + q < ni) {
          item(q0 + q, src, base);
          lim[q] = static_cast<int>(min(static_cast<int64_t>(hi), max(whole - base, static_cast<int64_t>(0))));
          src += base * K::N;
          dst[q] = out + base * K::N;
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (o + u * stride < lim[q]) v[u][q] = K::ld_peer(src, o + u * stride);
      }
#pragma unroll
      for (int q = 0; q < Gq; ++q)
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (o + u * stride < lim[q]) {
            if (kLast) K::st_last(dst[q], o + u * stride, v[u][q]);
            else K::st(dst[q], o + u * stride, v[u][q]);
          }
    }
  }
}

// The partial last pack of the tensor, element by element, in stage s (1 .. 4) of the round it belongs to. Kept
// out of line so the hot loops stay small. Same sources and order as the whole packs.
template <typename T>
__device__ __noinline__ void tail_stage(const TwoLevelArgs& a, T* out, int s) {
  const int64_t x0 = a.whole_packs * (16 / static_cast<int64_t>(sizeof(T)));
  const int c = a.tail_chunk, cl = c / a.G, cj = c % a.G;  // chunk (cl, cj): part cj of slice cl
  if (s == 1 && (a.g > 1 || a.G == 1) && cl == a.l) {  // partial sum over the group
    for (int64_t x = x0; x < a.n; ++x) {
      float acc = 0.0f;
      for (int m = 0; m < a.g; ++m) {
        const float v = to_float(static_cast<const T*>(a.in[a.k * a.g + m])[x]);
        acc = m == 0 ? v : acc + v;
      }
      out[x] = from_float<T>(acc);
    }
  } else if (s == 2 && a.G > 1 && cl == a.l && cj == a.k) {  // total over the counterparts
    for (int64_t x = x0; x < a.n; ++x) {
      float acc = 0.0f;
      for (int j = 0; j < a.G; ++j) {
        const int p = j * a.g + a.l;
        const T* src = static_cast<const T*>(a.g > 1 ? a.out[p] : a.in[p]);
        const float v = to_float(__ldcg(src + x));
        acc = j == 0 ? v : acc + v;
      }
      out[x] = from_float<T>(acc);
    }
  } else if (s == 3 && cl == a.l && cj != a.k) {  // from the counterpart that owns it
    const T* src = static_cast<const T*>(a.out[cj * a.g + a.l]);
    for (int64_t x = x0; x < a.n; ++x) out[x] = __ldcg(src + x);
  } else if (s == 4 && cl != a.l) {  // from the group member whose slice it is
    const T* src = static_cast<const T*>(a.out[a.k * a.g + cl]);
    for (int64_t x = x0; x < a.n; ++x) out[x] = __ldcg(src + x);
  }
}

// S1(i): slice l of the group's inputs, summed in rank order, into slice l of this rank's output (P, or the
// totals when G == 1).
template <typename T, bool V, int U>
__device__ __forceinline__ void stage1(const TwoLevelArgs& a, T* out, int first, int stride, int i) {
  if (a.g == 1 && a.G > 1) return;  // nothing to sum: S2 reads the counterparts' inputs
  const int lo = i * a.round_packs;
  const int hi = min(lo + a.round_packs, a.chunk_packs);
  auto src = [&](int m) { return static_cast<const T*>(a.in[a.k * a.g + m]); };
  for (int j = 0; j < a.G; ++j)
    reduce_part<T, V, U, true>(src, a.g, out, static_cast<int64_t>(a.l * a.G + j) * a.chunk_packs, lo, hi, first,
                               stride, a.whole_packs);
  if (i == a.tail_round && first == a.tail_thread) tail_stage<T>(a, out, 1);
}

// S2(i): chunk (l, k) summed over the counterparts' partial sums (their inputs when g == 1).
template <typename T, bool V, int U>
__device__ __forceinline__ void stage2(const TwoLevelArgs& a, T* out, int first, int stride, int i) {
  if (a.G == 1) return;  // S1's sums are the totals
  const int lo = i * a.round_packs;
  const int hi = min(lo + a.round_packs, a.chunk_packs);
  auto src = [&](int j) { return static_cast<const T*>(a.g > 1 ? a.out[j * a.g + a.l] : a.in[j * a.g + a.l]); };
  reduce_part<T, V, U, false>(src, a.G, out, static_cast<int64_t>(a.l * a.G + a.k) * a.chunk_packs, lo, hi, first,
                              stride, a.whole_packs);
  if (i == a.tail_round && first == a.tail_thread) tail_stage<T>(a, out, 2);
}

// S3(i): chunks (l, j), j != k, from their owners (j, l).
template <typename T, bool V, int U>
__device__ __forceinline__ void stage3(const TwoLevelArgs& a, T* out, int first, int stride, int i) {
  const int lo = i * a.round_packs;
  const int hi = min(lo + a.round_packs, a.chunk_packs);
  auto item = [&](int q, const T*& src, int64_t& base) {
    const int j = q < a.k ? q : q + 1;
    src = static_cast<const T*>(a.out[j * a.g + a.l]);
    base = static_cast<int64_t>(a.l * a.G + j) * a.chunk_packs;
  };
  copy_parts<T, V, U, false>(item, a.G - 1, out, lo, hi, first, stride, a.whole_packs);  // read again in S4
  if (i == a.tail_round && first == a.tail_thread) tail_stage<T>(a, out, 3);
}

// S4(i): every chunk of slice l', l' != l, from group member (k, l'), in the order l + 1, l + 2, ... so that the
// members of a group do not all read the same one at once.
template <typename T, bool V, int U>
__device__ __forceinline__ void stage4(const TwoLevelArgs& a, T* out, int first, int stride, int i) {
  const int lo = i * a.round_packs;
  const int hi = min(lo + a.round_packs, a.chunk_packs);
  auto item = [&](int q, const T*& src, int64_t& base) {
    const int d = q / a.G + 1, j = q % a.G;  // d = 1 .. g-1
    const int lp = a.l + d < a.g ? a.l + d : a.l + d - a.g;
    src = static_cast<const T*>(a.out[a.k * a.g + lp]);
    base = static_cast<int64_t>(lp * a.G + j) * a.chunk_packs;
  };
  copy_parts<T, V, U, true>(item, (a.g - 1) * a.G, out, lo, hi, first, stride, a.whole_packs);
  if (i == a.tail_round && first == a.tail_thread) tail_stage<T>(a, out, 4);
}

// Thread 0 of warp 0: publish stage `st` of round i (if it is a round) in this rank's own flags.
__device__ __forceinline__ void publish(const TwoLevelArgs& a, int i, int st) {
  if (i < 0 || i >= a.rounds) return;
  __threadfence_system();
  st_release_sys(a.flags[a.rank] + word(i, st), a.epoch);
}

__device__ __forceinline__ void wait_flag(const uint32_t* f, uint32_t epoch) {
  while (static_cast<int32_t>(ld_acquire_sys(f) - epoch) < 0) {
  }
}

// Warp 0 before iteration t's data steps S2(t-1), S3(t-2), S4(t-3): lane j < G waits for counterpart (j, l)'s
// F1(t-1) (S2 reads its P) and F2(t-2) (S3 reads its total, and overwrites the P it read); lane 8 + m for group
// member (k, m)'s F3(t-3) (S4 reads its final slice).
__device__ __forceinline__ void wait_peers(const TwoLevelArgs& a, int t) {
  const int x = threadIdx.x;
  if (x < a.G && x != a.k) {
    const uint32_t* f = a.flags[x * a.g + a.l];
    if (a.g > 1 && t - 1 >= 0 && t - 1 < a.rounds) wait_flag(f + word(t - 1, kF1), a.epoch);
    if (t - 2 >= 0 && t - 2 < a.rounds) wait_flag(f + word(t - 2, kF2), a.epoch);
  } else if (x >= 8 && x < 8 + a.g && x - 8 != a.l) {
    const uint32_t* f = a.flags[a.k * a.g + (x - 8)];
    if (t - 3 >= 0 && t - 3 < a.rounds) wait_flag(f + word(t - 3, kF3), a.epoch);
  }
}

template <typename T, bool V, int U>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) two_level_kernel(const __grid_constant__ TwoLevelArgs a) {
  T* out = static_cast<T*>(const_cast<void*>(a.out[a.rank]));
  const bool sync_warp = threadIdx.x < 32;
  const int first = static_cast<int>(blockIdx.x) * kDataThreads + (static_cast<int>(threadIdx.x) - 32);
  const int stride = static_cast<int>(gridDim.x) * kDataThreads;
  // Iteration t: S1(t) | barrier | S2(t-1), S3(t-2), S4(t-3) | barrier. Iterations rounds .. rounds + 2 only drain.
#pragma unroll 1
  for (int t = 0; t < a.rounds + 3; ++t) {
    if (sync_warp) {
      if (threadIdx.x == 0) {  // what the data warps finished in the previous iteration
        publish(a, t - 2, kF2);
        publish(a, t - 3, kF3);
      }
      __syncwarp();
      wait_peers(a, t);
    } else if (t < a.rounds) {
      stage1<T, V, U>(a, out, first, stride, t);
    }
    __syncthreads();
    if (sync_warp) {
      if (threadIdx.x == 0) publish(a, t, kF1);
    } else {
      if (t - 1 >= 0 && t - 1 < a.rounds) stage2<T, V, U>(a, out, first, stride, t - 1);
      if (t - 2 >= 0 && t - 2 < a.rounds) stage3<T, V, U>(a, out, first, stride, t - 2);
      if (t - 3 >= 0 && t - 3 < a.rounds) stage4<T, V, U>(a, out, first, stride, t - 3);
    }
    __syncthreads();
  }
}

// Ranks that share this rank's GPU. The judge puts either every rank on one GPU (cuda-shared) or one rank on each
// GPU (cuda), so any reachable peer tells which; every rank computes the same answer.
int ranks_per_gpu(const cb_args* a, int g) {
  if (a->world < 2) return 1;
  const int peer = g > 1 ? (a->rank / g) * g + (a->rank % g + 1) % g : (a->rank + 1) % a->world;
  if (a->peer_flags[peer] == nullptr) return a->world;  // unknown: assume the worst
  cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, a->peer_flags[peer]) != cudaSuccess) {
    (void)cudaGetLastError();
    return a->world;
  }
  return at.device == a->device ? a->world : 1;
}

int64_t ceil_div(int64_t x, int64_t y) { return (x + y - 1) / y; }

template <typename T, bool V, int U>
int launch_kernel(const cb_args* a, TwoLevelArgs& k, cudaStream_t stream) {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, a->device) != cudaSuccess || sms < 1) return 2;
  // Blocks that fit on one SM, asked of the vector kernel whichever is launched: the grid must not depend on
  // the pointers (every rank must compute the same grid).
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, two_level_kernel<T, true, U>, kThreads, 0) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    per_sm = 1;
  }
  per_sm = per_sm < 1 ? 1 : (per_sm > kBlocksPerSm ? kBlocksPerSm : per_sm);
  int64_t grid = ceil_div(k.chunk_packs, kDataThreads);
  const int64_t resident = static_cast<int64_t>(sms) * per_sm / ranks_per_gpu(a, k.g);
  if (grid > resident) grid = resident;
  if (grid > a->flag_words / 3) grid = a->flag_words / 3;  // at least one round's flag words
  if (grid < 1) return 5;  // fewer than 3 flag words
  // Rounds: one step of U packs per data thread, chunk and round (a part of a round is read back by the peers a
  // round or two later, so small rounds keep it in the L2); more only where the flag words run out.
  const int64_t stride = grid * kDataThreads;
  const int64_t max_rounds = a->flag_words / (3 * grid);
  int64_t per_thread = U;
  const int64_t needed = ceil_div(k.chunk_packs, max_rounds * stride);
  if (per_thread < needed) per_thread = needed;
  k.round_packs = static_cast<int>(per_thread * stride);
  k.rounds = static_cast<int>(ceil_div(k.chunk_packs, k.round_packs));
  k.tail_chunk = k.tail_round = k.tail_thread = -1;
  if (k.whole_packs * Packs<T, V>::N < k.n) {  // pack whole_packs is partial: the thread it falls to does it
    const int64_t o = k.whole_packs % k.chunk_packs;
    k.tail_chunk = static_cast<int>(k.whole_packs / k.chunk_packs);
    k.tail_round = static_cast<int>(o / k.round_packs);
    k.tail_thread = static_cast<int>(o % stride);
  }
  two_level_kernel<T, V, U><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(k);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}

template <typename T>
int launch(const cb_args* a, int g, cudaStream_t stream) {
  TwoLevelArgs k{};
  bool aligned = true;
  for (int p = 0; p < a->world; ++p) {
    k.in[p] = a->peer_in[p];
    k.out[p] = a->peer_out[p];
    k.flags[p] = a->peer_flags[p];
    aligned = aligned && ((reinterpret_cast<uintptr_t>(a->peer_in[p]) | reinterpret_cast<uintptr_t>(a->peer_out[p])) & 15) == 0;
  }
  constexpr int N = 16 / sizeof(T);
  k.n = a->count;
  k.rank = a->rank;
  k.world = a->world;
  k.epoch = a->epoch;
  k.g = g;
  k.G = a->world / g;
  k.k = a->rank / g;
  k.l = a->rank % g;
  k.whole_packs = a->count / N;
  const int64_t chunk_packs = ceil_div(ceil_div(a->count, N), a->world);
  if (chunk_packs > (1 << 29)) return 4;  // offsets within a chunk (plus a round and two strides) stay 32-bit
  k.chunk_packs = static_cast<int>(chunk_packs);
  // U = 2 packs per step up to world 4, 1 at world 8 (each round then holds twice the chunks in the L2).
  if (a->world <= 4) return aligned ? launch_kernel<T, true, 2>(a, k, stream) : launch_kernel<T, false, 2>(a, k, stream);
  return aligned ? launch_kernel<T, true, 1>(a, k, stream) : launch_kernel<T, false, 1>(a, k, stream);
}

}  // namespace

CB_ENTRY all_reduce(const cb_args* args, cudaStream_t stream) {
  if (args->count <= 0) return 0;  // every rank returns: nobody waits
  if (args->world < 1 || args->world > CB_MAX_RANKS) return 1;
  const int64_t g = args->params[0];
  if (g < 1 || g > args->world || args->world % g != 0) return 1;
  switch (args->dtype) {
    case CB_FLOAT32: return launch<float>(args, static_cast<int>(g), stream);
    case CB_FLOAT16: return launch<__half>(args, static_cast<int>(g), stream);
    case CB_BFLOAT16: return launch<__nv_bfloat16>(args, static_cast<int>(g), stream);
    default: return 1;
  }
}
