// Reference: MoE token dispatch over peer pointers that quantises every token to fp8 e4m3 on the way, with one
// float32 scale per 128 channels (the layout of DeepEP's fp8 dispatch), in ONE kernel per rank. Its skeleton is
// ep/dispatch_cuda's reference (read that header for the row order, the count table and the flag protocol); what
// differs is the payload and a third flag:
//
// Rank s sends token i to every rank r that hosts one of its experts. The G blocks of every rank split its tokens
// into G contiguous ranges; token i of block (s, b) lands at row off(q, r) + slot(i, r) of rank r (q = s G + b).
// Every block, with no kernel before it:
//   1. counts its own tokens (rank masks from topk_idx, slot(i, r) by a ballot per rank and a scan over the warps)
//      while the first 64 KiB of its x rows are prefetched into L2;
//   2. writes its row q of counts into every rank's count table and raises count flag q there;
//   3. waits for all world * G count flags, derives off(q, r) and n (the rows this rank receives);
//   4. stages each token's index and local top-k ids at every destination (scratch), raises done flag q;
//   5. quantises and sends its tokens: one warp per (token, 4 KiB of bfloat16 x) unit, each lane loading four
//      16-byte words (8 channels each) once; the 16 lanes that hold one 128-channel block take its amax with four
//      xor shuffles, scale = max(amax, 1e-4f) / 448 (an IEEE division, as the contract says), the codes are
//      x * (448 / max(amax, 1e-4f)) rounded to nearest e4m3 with saturation (cvt.rn.satfinite.e4m3x2: 8 codes per
//      lane, one 8-byte store per destination), and the block's first lane stores the scale into each
//      destination's scale staging area (scratch: receivers' aux outputs are not reachable); then payload flag q
//      on every rank;
//   6. zeroes its share of the own tail (codes of rows n .. world * T, their scales), fills recv_src / recv_topk
//      beyond n with -1, and sums recv_counts from the table;
//   7. waits for the done flags (raised in step 4) and copies the staged metadata of rows < n out; then waits for
//      the payload flags (step 5) and copies the staged scales of rows < n into recv_scales.
// Rows whose size is not a multiple of 16 bytes (d not a multiple of 8 for 16-bit x, of 4 for float32) go one
// warp per (token, 128-channel block), one channel per lane and step, one byte per store.
//
// Bound (HBM bytes, cuda-shared). With B = T * d * elt (the metric's size) and bfloat16 x, every rank reads its x
// (B) and writes its whole recv_x of world * T rows of d one-byte codes (world * B / 2, received rows plus the zero
// tail, whatever the routing), plus 4 bytes of scale per 128 channels and metadata (under 4 % more). The judge's
// roofline is the device copy rate C (C read and C written per second) split into C / world per rank; all ranks
// at once move world (1 + world / 2) B, so algbw = B / t <= (C / world) * 4 / (world + 2): 100 % of the copy
// roofline at world 2, 67 % at 4, 40 % at 8. 70 % of that bound is the target (at 16 MiB, world 2: 2 * 16.8 MB
// read and as much written at 4.2 TB/s is 16 us, so about a 23 us call; steps 1-3 take about 3 us).
//
// Flags: words [0, R) count flags, [R, 2R) done flags, [2R, 3R) payload flags, R = world * G; epoch-valued,
// release/acquire at system scope, never reset (as in ep/dispatch_cuda). Deadlock freedom: every block raises
// each kind of flag before it waits for the next kind, so all world * G blocks must be resident at once: one
// block per SM (__launch_bounds__(512, 1)), G <= SMs (one GPU per rank) or world * G <= SMs (cuda-shared).
#include "commbench.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;                      // 16-byte words per lane per unit
constexpr int kPrefetchBytes = 128 * kThreads;  // one 128-byte line per thread: 64 KiB of x per block
constexpr int kBlock = 128;                     // channels per scale
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void wait_flag(const uint32_t* p, uint32_t epoch) {
  while (static_cast<int32_t>(ld_acquire_sys(p) - epoch) < 0) __nanosleep(32);
}

__device__ __forceinline__ int warp_sum(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// ---- element types: 16-byte words of x as floats, codes of one word --------------------------------------------
template <typename T> struct Elem;
template <> struct Elem<float> {
  static constexpr int kPerWord = 4;
  using Codes = uint32_t;  // 4 codes
  __device__ static void unpack(const uint4& w, float (&f)[4]) {
    f[0] = __uint_as_float(w.x); f[1] = __uint_as_float(w.y); f[2] = __uint_as_float(w.z); f[3] = __uint_as_float(w.w);
  }
  __device__ static float one(const float* x, int64_t i) { return x[i]; }
};
template <> struct Elem<__nv_bfloat16> {
  static constexpr int kPerWord = 8;
  using Codes = uint2;  // 8 codes
  __device__ static void unpack(const uint4& w, float (&f)[8]) {
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      f[2 * j] = __uint_as_float(u[j] << 16);
      f[2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
    }
  }
  __device__ static float one(const __nv_bfloat16* x, int64_t i) { return __bfloat162float(x[i]); }
};
template <> struct Elem<__half> {
  static constexpr int kPerWord = 8;
  using Codes = uint2;
  __device__ static void unpack(const uint4& w, float (&f)[8]) {
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&u[j]));
      f[2 * j] = p.x;
      f[2 * j + 1] = p.y;
    }
  }
  __device__ static float one(const __half* x, int64_t i) { return __half2float(x[i]); }
};

__device__ __forceinline__ uint32_t fp8x4(float a, float b, float c, float d) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}
__device__ __forceinline__ void pack_codes(const float (&f)[4], float inv, uint32_t& out) {
  out = fp8x4(f[0] * inv, f[1] * inv, f[2] * inv, f[3] * inv);
}
__device__ __forceinline__ void pack_codes(const float (&f)[8], float inv, uint2& out) {
  out.x = fp8x4(f[0] * inv, f[1] * inv, f[2] * inv, f[3] * inv);
  out.y = fp8x4(f[4] * inv, f[5] * inv, f[6] * inv, f[7] * inv);
}

// Scratch of every rank, in bytes (the same offsets everywhere). 4-byte arrays only.
struct Layout {
  int64_t slots;      // int32 [T][world]: slot of each own token among its block's tokens sent to r, -1 if not
  int64_t meta_src;   // int32 [world * T]: token index of each received row (staged by the senders)
  int64_t meta_topk;  // int32 [world * T][k]: local top-k ids of each received row
  int64_t meta_scale; // float [world * T][nb]: scales of each received row
  int64_t table;      // int32 [world * G][world]: every block's counts
  int64_t total;
};

Layout layout_of(int64_t tokens, int64_t k, int64_t nb, int world, int64_t grid) {
  Layout l{};
  l.slots = 0;
  l.meta_src = l.slots + tokens * world * 4;
  l.meta_topk = l.meta_src + world * tokens * 4;
  l.meta_scale = l.meta_topk + world * tokens * k * 4;
  l.table = l.meta_scale + world * tokens * nb * 4;
  l.total = l.table + world * grid * world * 4;
  return l;
}

struct DispatchArgs {
  const void* x;                      // [T, d] this rank's tokens
  const int64_t* topk;                // [T, k]
  int32_t* slots;                     // own scratch
  int32_t* table[CB_MAX_RANKS];       // every rank's count table
  uint8_t* out[CB_MAX_RANKS];         // every rank's recv_x (codes)
  int32_t* meta_src[CB_MAX_RANKS];    // every rank's staging areas
  int32_t* meta_topk[CB_MAX_RANKS];
  float* meta_scale[CB_MAX_RANKS];
  uint32_t* flags[CB_MAX_RANKS];
  float* recv_scales;                 // own outputs
  int32_t* recv_src;
  int32_t* recv_topk;
  int32_t* recv_counts;
  int64_t tokens, d, nb;
  int k, epr, world, rank;
  uint32_t epoch;
};

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads, 1) dispatch_kernel(const __grid_constant__ DispatchArgs a) {
  using E = Elem<T>;
  __shared__ unsigned mask_s[kThreads];          // rank mask of each token of the current round
  __shared__ int warp_base[kWarps][CB_MAX_RANKS];
  __shared__ int carry[CB_MAX_RANKS];            // this block's tokens sent to each rank (running, then total)
  __shared__ int off[CB_MAX_RANKS];              // first row of this block's tokens in each destination
  __shared__ int recv_rows;                      // n: rows this rank receives

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned below = (1u << lane) - 1u;
  const int G = gridDim.x, world = a.world, k = a.k;
  const int R = world * G;
  const int me = a.rank * G + blockIdx.x;
  const int experts = world * a.epr;
  const int64_t t0 = a.tokens * blockIdx.x / G, t1 = a.tokens * (blockIdx.x + 1) / G;
  const int64_t ntok = t1 - t0;
  const int64_t gtid = static_cast<int64_t>(blockIdx.x) * kThreads + tid;
  const int64_t gthreads = static_cast<int64_t>(G) * kThreads;
  const int64_t cap = static_cast<int64_t>(world) * a.tokens;
  const int64_t d = a.d, nb = a.nb;
  const T* x = static_cast<const T*>(a.x);

  // 0. the first rows of this block's x into L2 now: their reads overlap the count exchange below
  {
    const int64_t bytes = ntok * d * static_cast<int64_t>(sizeof(T));
    const int64_t at = static_cast<int64_t>(tid) * 128;
    if (at < bytes && at < kPrefetchBytes)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(reinterpret_cast<const char*>(x + t0 * d) + at));
  }

  // 1. this block's counts, in rounds of kThreads tokens
  if (tid < CB_MAX_RANKS) carry[tid] = 0;
  for (int64_t base = t0; base < t1; base += kThreads) {  // block-uniform rounds
    const int nr = t1 - base < kThreads ? static_cast<int>(t1 - base) : kThreads;
    mask_s[tid] = 0;
    __syncthreads();  // also orders the zeroing of carry before its first use
    const int64_t* tk = a.topk + base * k;
    for (int q = tid; q < nr * k; q += kThreads) {
      const int64_t e = tk[q];
      if (e >= 0 && e < experts) atomicOr(&mask_s[q / k], 1u << static_cast<int>(e / a.epr));
    }
    __syncthreads();
    const uint32_t mask = tid < nr ? mask_s[tid] : 0u;
    int pre[CB_MAX_RANKS];
#pragma unroll
    for (int r = 0; r < CB_MAX_RANKS; ++r) {
      const unsigned bal = __ballot_sync(kFull, (mask >> r) & 1u);
      pre[r] = __popc(bal & below);
      if (lane == 0) warp_base[warp][r] = __popc(bal);
    }
    __syncthreads();
    if (tid < world) {  // exclusive scan over the warps, carried over the rounds
      int run = carry[tid];
      for (int w = 0; w < kWarps; ++w) {
        const int t = warp_base[w][tid];
        warp_base[w][tid] = run;
        run += t;
      }
      carry[tid] = run;
    }
    __syncthreads();
    if (tid < nr) {
      int32_t* sl = a.slots + (base + tid) * world;
#pragma unroll
      for (int r = 0; r < CB_MAX_RANKS; ++r)
        if (r < world) sl[r] = ((mask >> r) & 1u) ? warp_base[warp][r] + pre[r] : -1;
    }
    // the next round's first __syncthreads protects mask_s, warp_base and carry
  }
  __syncthreads();  // carry final (also when this block has no tokens)

  // 2. row `me` of every rank's table, then count flag `me`
  for (int idx = tid; idx < world * world; idx += kThreads) {
    const int p = idx / world, c = idx - p * world;
    a.table[p][static_cast<int64_t>(me) * world + c] = carry[c];
  }
  if (tid < CB_MAX_RANKS) off[tid] = 0;
  if (tid == 0) recv_rows = 0;
  __syncthreads();
  if (tid < world) {
    __threadfence_system();
    st_release_sys(a.flags[tid] + me, a.epoch);
  }

  // 3. every row of the own table; off(me, r) = sum of rows q < me, n = sum of every row's column `rank`
  for (int q = tid; q < R; q += kThreads) wait_flag(a.flags[a.rank] + q, a.epoch);
  __syncthreads();
  const int32_t* table = a.table[a.rank];
  {
    int part[CB_MAX_RANKS];
#pragma unroll
    for (int r = 0; r < CB_MAX_RANKS; ++r) part[r] = 0;
    int n_part = 0;
    for (int q = tid; q < R; q += kThreads) {
      const int32_t* row = table + static_cast<int64_t>(q) * world;
#pragma unroll
      for (int r = 0; r < CB_MAX_RANKS; ++r)
        if (r < world) {
          const int v = __ldcg(row + r);
          if (q < me) part[r] += v;
          if (r == a.rank) n_part += v;
        }
    }
#pragma unroll
    for (int r = 0; r < CB_MAX_RANKS; ++r)
      if (r < world) {
        const int v = warp_sum(part[r]);
        if (lane == 0 && v != 0) atomicAdd(&off[r], v);
      }
    n_part = warp_sum(n_part);
    if (lane == 0 && n_part != 0) atomicAdd(&recv_rows, n_part);
  }
  __syncthreads();
  const int64_t n_recv = recv_rows;

  // 4. stage index and local top-k ids of this block's tokens at their destinations, then done flag `me`
  for (int64_t q = tid; q < ntok * k; q += kThreads) {
    const int64_t i = t0 + q / k;
    const int j = static_cast<int>(q % k);
    const int64_t e = a.topk[t0 * k + q];
    const int owner = (e >= 0 && e < experts) ? static_cast<int>(e / a.epr) : -1;
    const int32_t* sl = a.slots + i * world;
#pragma unroll
    for (int r = 0; r < CB_MAX_RANKS; ++r)
      if (r < world) {
        const int s = sl[r];
        if (s >= 0) {
          const int64_t row = off[r] + static_cast<int64_t>(s);
          a.meta_topk[r][row * k + j] = owner == r ? static_cast<int32_t>(e - static_cast<int64_t>(r) * a.epr) : -1;
          if (j == 0) a.meta_src[r][row] = static_cast<int32_t>(i);
        }
      }
  }
  __syncthreads();
  if (tid < world) {
    __threadfence_system();
    st_release_sys(a.flags[tid] + R + me, a.epoch);
  }

  // 5. payload: quantise each 128-channel block once, store its codes and scale at every destination
  if (kVec) {
    constexpr int kEpw = E::kPerWord;         // channels per 16-byte word of x
    constexpr int kLanes = kBlock / kEpw;     // lanes per 128-channel block: 16 (16-bit x) or 32 (float32)
    using Codes = typename E::Codes;
    const int64_t nwords = d / kEpw;
    const int64_t chunk = 32 * kUnroll;
    const int64_t upt = (nwords + chunk - 1) / chunk;  // units per token
    for (int64_t u = warp; u < ntok * upt; u += kWarps) {
      const int64_t i = t0 + u / upt;
      const int64_t w0 = (u % upt) * chunk + lane;
      const int my_slot = lane < world ? a.slots[i * world + lane] : -1;
      const unsigned dests = __ballot_sync(kFull, my_slot >= 0);
      if (dests == 0u) continue;  // warp-uniform: a token routed nowhere
      int64_t row[CB_MAX_RANKS];
#pragma unroll
      for (int r = 0; r < CB_MAX_RANKS; ++r) {
        const int s = __shfl_sync(kFull, my_slot, r);
        row[r] = ((dests >> r) & 1u) ? off[r] + static_cast<int64_t>(s) : -1;
      }
      const uint4* src = reinterpret_cast<const uint4*>(x + i * d);
      uint4 v[kUnroll];
#pragma unroll
      for (int q = 0; q < kUnroll; ++q)
        if (w0 + q * 32 < nwords) v[q] = __ldcs(src + w0 + q * 32);  // read once: evict first
#pragma unroll
      for (int q = 0; q < kUnroll; ++q) {
        const int64_t w = w0 + q * 32;
        const bool in = w < nwords;
        float f[kEpw];
        float m = 0.f;
        if (in) {
          E::unpack(v[q], f);
#pragma unroll
          for (int j = 0; j < kEpw; ++j) m = fmaxf(m, fabsf(f[j]));
        }
#pragma unroll
        for (int o = kLanes / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, o));
        const float amax = fmaxf(m, 1e-4f);
        const float scale = amax / 448.0f;
        if (!in) continue;  // (every lane reaches the next step's shuffle)
        Codes c;
        pack_codes(f, 448.0f / amax, c);
        const bool head = (lane & (kLanes - 1)) == 0;
#pragma unroll
        for (int r = 0; r < CB_MAX_RANKS; ++r)
          if (row[r] >= 0) {
            reinterpret_cast<Codes*>(a.out[r] + row[r] * d)[w] = c;
            if (head) a.meta_scale[r][row[r] * nb + w / kLanes] = scale;
          }
      }
    }
  } else {  // any d: one warp per (token, 128-channel block), one channel per lane and step
    for (int64_t u = warp; u < ntok * nb; u += kWarps) {
      const int64_t i = t0 + u / nb;
      const int64_t b = u % nb;
      const int my_slot = lane < world ? a.slots[i * world + lane] : -1;
      const unsigned dests = __ballot_sync(kFull, my_slot >= 0);
      if (dests == 0u) continue;
      int64_t row[CB_MAX_RANKS];
#pragma unroll
      for (int r = 0; r < CB_MAX_RANKS; ++r) {
        const int s = __shfl_sync(kFull, my_slot, r);
        row[r] = ((dests >> r) & 1u) ? off[r] + static_cast<int64_t>(s) : -1;
      }
      float f[kBlock / 32];
      float m = 0.f;
#pragma unroll
      for (int j = 0; j < kBlock / 32; ++j) {
        const int64_t c = b * kBlock + j * 32 + lane;
        f[j] = c < d ? E::one(x, i * d + c) : 0.f;
        m = fmaxf(m, fabsf(f[j]));
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, o));
      const float amax = fmaxf(m, 1e-4f);
      const float scale = amax / 448.0f, inv = 448.0f / amax;
#pragma unroll
      for (int r = 0; r < CB_MAX_RANKS; ++r)
        if (row[r] >= 0) {
#pragma unroll
          for (int j = 0; j < kBlock / 32; ++j) {
            const int64_t c = b * kBlock + j * 32 + lane;
            if (c < d) a.out[r][row[r] * d + c] = __nv_cvt_float_to_fp8(f[j] * inv, __NV_SATFINITE, __NV_E4M3);
          }
          if (lane == 0) a.meta_scale[r][row[r] * nb + b] = scale;
        }
    }
  }
  __syncthreads();
  if (tid < world) {
    __threadfence_system();
    st_release_sys(a.flags[tid] + 2 * R + me, a.epoch);
  }

  // 6. the own tail (codes of rows n .. cap as zero bytes, their scales 0), -1 beyond n, and the counts
  {
    uint8_t* base = a.out[a.rank];
    const int64_t lo = n_recv * d, hi = cap * d;
    const int64_t lo16 = lo + ((16 - (reinterpret_cast<uintptr_t>(base + lo) & 15)) & 15);
    const int64_t body_lo = lo16 < hi ? lo16 : hi;
    const int64_t body_n = (hi - body_lo) / 16;
    const int64_t body_hi = body_lo + body_n * 16;
    for (int64_t q = lo + gtid; q < body_lo; q += gthreads) base[q] = 0;
    uint4* body = reinterpret_cast<uint4*>(base + body_lo);
    for (int64_t q = gtid; q < body_n; q += gthreads) body[q] = make_uint4(0u, 0u, 0u, 0u);
    for (int64_t q = body_hi + gtid; q < hi; q += gthreads) base[q] = 0;
    for (int64_t q = n_recv * nb + gtid; q < cap * nb; q += gthreads) a.recv_scales[q] = 0.f;
    for (int64_t q = n_recv + gtid; q < cap; q += gthreads) a.recv_src[q] = -1;
    for (int64_t q = n_recv * k + gtid; q < cap * k; q += gthreads) a.recv_topk[q] = -1;
    // one warp per source: recv_counts[s] sums column `rank` over the G rows of source s
    for (int t = blockIdx.x * kWarps + warp; t < world; t += G * kWarps) {
      int s = 0;
      for (int b = lane; b < G; b += 32) s += __ldcg(table + static_cast<int64_t>(t * G + b) * world + a.rank);
      s = warp_sum(s);
      if (lane == 0) a.recv_counts[t] = s;
    }
  }

  // 7. the staged metadata (done flags, step 4), then the staged scales (payload flags, step 5)
  for (int q = tid; q < R; q += kThreads) wait_flag(a.flags[a.rank] + R + q, a.epoch);
  __syncthreads();
  const int32_t* ms = a.meta_src[a.rank];
  const int32_t* mt = a.meta_topk[a.rank];
  for (int64_t q = gtid; q < n_recv; q += gthreads) a.recv_src[q] = __ldcg(ms + q);
  for (int64_t q = gtid; q < n_recv * k; q += gthreads) a.recv_topk[q] = __ldcg(mt + q);
  for (int q = tid; q < R; q += kThreads) wait_flag(a.flags[a.rank] + 2 * R + q, a.epoch);
  __syncthreads();
  const float* sc = a.meta_scale[a.rank];
  for (int64_t q = gtid; q < n_recv * nb; q += gthreads) a.recv_scales[q] = __ldcg(sc + q);
}

// Ranks that share this rank's GPU: every rank on one GPU (cuda-shared) or one rank per GPU (cuda).
int ranks_per_gpu(const cb_args* a) {
  if (a->world < 2) return 1;
  cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, a->peer_flags[(a->rank + 1) % a->world]) != cudaSuccess) {
    (void)cudaGetLastError();
    return a->world;  // unknown: assume the worst
  }
  return at.device == a->device ? a->world : 1;
}

template <typename T>
void launch_dispatch(const DispatchArgs& d, bool vec, int64_t grid, cudaStream_t stream) {
  if (vec) dispatch_kernel<T, true><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(d);
  else dispatch_kernel<T, false><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(d);
}

}  // namespace

CB_ENTRY dispatch(const cb_args* args, cudaStream_t stream) {
  const int world = args->world;
  const int64_t esz = args->dtype == CB_FLOAT32 ? 4 : (args->dtype == CB_BFLOAT16 || args->dtype == CB_FLOAT16) ? 2 : 0;
  const int64_t epr = args->params[0], k = args->params[1];
  if (esz == 0 || world < 1 || world > CB_MAX_RANKS || epr < 1 || k < 1 || k > 32 || world * epr > 1024) return 1;
  if (args->aux_in_count[0] % k != 0) return 4;
  const int64_t tokens = args->aux_in_count[0] / k;
  if (args->aux_out_count[3] != world) return 4;
  if (tokens == 0) {  // nothing to send or receive: only the counts, all zero
    if (cudaMemsetAsync(args->aux_out[3], 0, world * sizeof(int32_t), stream) != cudaSuccess) return 3;
    return 0;
  }
  if (args->count % tokens != 0) return 4;
  const int64_t d = args->count / tokens;
  const int64_t nb = (d + kBlock - 1) / kBlock;
  const int64_t cap = world * tokens;
  if (args->out_count != cap * d || args->aux_out_count[0] != cap * nb || args->aux_out_count[1] != cap ||
      args->aux_out_count[2] != cap * k)
    return 4;

  // G, from values every rank shares: all blocks of all ranks on this GPU resident at once (one per SM), three
  // flag words per block and rank, and the count table in the scratch buffer.
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  int64_t grid = sms / ranks_per_gpu(args);
  if (grid > args->flag_words / (3 * world)) grid = args->flag_words / (3 * world);
  const int64_t fixed = layout_of(tokens, k, nb, world, 0).total;
  const int64_t per_block = world * world * 4;
  if (grid > (args->scratch_bytes - fixed) / per_block) grid = (args->scratch_bytes - fixed) / per_block;
  if (grid < 1) return 5;  // too few SMs, flag words or scratch for even one block per rank
  const Layout l = layout_of(tokens, k, nb, world, grid);

  DispatchArgs a{};
  a.x = args->in;
  a.topk = static_cast<const int64_t*>(args->aux_in[0]);
  a.slots = reinterpret_cast<int32_t*>(static_cast<char*>(args->scratch) + l.slots);
  // 16-byte words of x and whole words of codes: the row size a multiple of 16 bytes, x 16-byte aligned and every
  // recv_x aligned to a word of codes (8 bytes for 16-bit x, 4 for float32)
  const int64_t epw = 16 / esz;
  bool vec = d % epw == 0 && reinterpret_cast<uintptr_t>(args->in) % 16 == 0;
  for (int p = 0; p < world; ++p) {
    char* ps = static_cast<char*>(args->peer_scratch[p]);
    a.table[p] = reinterpret_cast<int32_t*>(ps + l.table);
    a.out[p] = static_cast<uint8_t*>(args->peer_out[p]);
    a.meta_src[p] = reinterpret_cast<int32_t*>(ps + l.meta_src);
    a.meta_topk[p] = reinterpret_cast<int32_t*>(ps + l.meta_topk);
    a.meta_scale[p] = reinterpret_cast<float*>(ps + l.meta_scale);
    a.flags[p] = args->peer_flags[p];
    vec = vec && reinterpret_cast<uintptr_t>(args->peer_out[p]) % epw == 0;
  }
  a.recv_scales = static_cast<float*>(args->aux_out[0]);
  a.recv_src = static_cast<int32_t*>(args->aux_out[1]);
  a.recv_topk = static_cast<int32_t*>(args->aux_out[2]);
  a.recv_counts = static_cast<int32_t*>(args->aux_out[3]);
  a.tokens = tokens;
  a.d = d;
  a.nb = nb;
  a.k = static_cast<int>(k);
  a.epr = static_cast<int>(epr);
  a.world = world;
  a.rank = args->rank;
  a.epoch = args->epoch;

  switch (args->dtype) {
    case CB_FLOAT32: launch_dispatch<float>(a, vec, grid, stream); break;
    case CB_BFLOAT16: launch_dispatch<__nv_bfloat16>(a, vec, grid, stream); break;
    default: launch_dispatch<__half>(a, vec, grid, stream); break;
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
