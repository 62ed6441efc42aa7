// Reference: low-latency MoE combine from fixed per-(local expert, source rank) slots, in ONE kernel per rank
// (the layout of DeepEP's low-latency mode; no layout exchange, no count exchange).
//
// Rank r holds the expert outputs of its epr local experts in the dispatch's slots: slot (l, s), rows
// [s * M, s * M + count[l][s]) of expert_y[l], row p = the token slot_src_idx[l][s * M + p] of rank s. Every rank
// keeps in its scratch a receive area of E * M rows, row (e, i) for "expert e's output for my token i": each row
// has exactly one writer (the owner of e) and its place is known to that writer alone, so no offsets are
// exchanged; and the token's rank knows from its own topk_idx which rows it will read, so no counts are needed
// either, only a "done" flag per sending block. The G blocks of every rank, as senders:
//   1. build the prefix of the slot counts in shared memory (one warp scan over epr * world counts), so that the
//      valid rows of all slots form one dense range that the grid splits evenly (a binary search maps a dense
//      row index back to its slot); padding rows are never touched;
//   2. copy each valid row once, in units of (row, 32 lanes x 4 words of 16 bytes), from expert_y into row
//      (r * epr + l, token) of the source's receive area (args->peer_scratch[s]);
//   3. raise their done flag (r, b) on every rank: __syncthreads, __threadfence_system, st.release.sys of epoch.
// Then, as receivers:
//   4. wait for the done flags of every block of every rank (ld.acquire.sys, then __syncthreads);
//   5. reduce: one warp per (token, 32 words), each lane loads the word of all k rows of its token first (up to 8
//      in flight, __ldcg: peers wrote them during this kernel), then accumulates weight * row in float32 in slot
//      order and rounds once to the output type; masked entries are skipped (their weights are NaN).
//
// Latency: the call is one kernel launch, one copy of the valid rows (M * k rows per rank with balanced routing),
// one flag round trip and one local reduce. Target on one H200 (cuda-shared, bfloat16, d = 7168, k = 8): about
// 10 us at M = 16 (2 MiB of rows per rank: launch, a flag round trip and about 3x the rows' bytes of HBM traffic
// over all ranks), about 40 us at M = 128 at world 4 (the rows are read, stored, read back and reduced: some 180
// MB of HBM traffic at about 4.5 TB/s). The floor without a staging copy would need the expert outputs to be
// pullable, which this task rules out (peer_in is NULL).
//
// Memory ordering: the rows are plain stores into the receiver's scratch; each sending block's stores are
// ordered before its flag by __syncthreads() + __threadfence_system() + st.release.sys (cumulative through the
// barrier); the receiver polls with ld.acquire.sys until flag - epoch >= 0, __syncthreads(), then reads with
// ld.global.cg. Nothing is reset: epochs grow by one per call, and the judge synchronises every device between
// calls, so a receive row is never rewritten while it is read.
//
// Deadlock freedom: every block sends everything (steps 1-3) before it waits (step 4), so the waits end once all
// blocks of all ranks have started: all blocks must be resident together. One block per SM always fits
// (__launch_bounds__(512, 1), 4 KiB of shared memory), and G = SMs / (ranks on this GPU); G depends only on the GPU
// and the world (never on T, which differs between ranks), so every rank computes the same G.
#include "commbench.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;         // sender: words per lane in flight (2 KiB per warp with 16-byte words)
constexpr int kBatch = 8;          // receiver: rows of one token loaded before they are added
constexpr int kMaxSlots = 1024;    // E = world * epr
constexpr int kMaxTokens = 1024;   // M

enum Kind { kF32 = 0, kF16 = 1, kBF16 = 2 };

template <int B> struct Word;
template <> struct Word<16> { using type = uint4; };
template <> struct Word<8> { using type = uint2; };
template <> struct Word<4> { using type = unsigned int; };
template <> struct Word<2> { using type = unsigned short; };

// A word and its elements' bits (type punning through a union of built-in types).
template <int B> union Pack;
template <> union Pack<16> { uint4 w; uint32_t u32[4]; uint16_t u16[8]; };
template <> union Pack<8> { uint2 w; uint32_t u32[2]; uint16_t u16[4]; };
template <> union Pack<4> { unsigned int w; uint32_t u32[1]; uint16_t u16[2]; };
template <> union Pack<2> { unsigned short w; uint16_t u16[1]; };

template <int K, int B> struct Elems {
  static constexpr int n = K == kF32 ? B / 4 : B / 2;
  static __device__ __forceinline__ float get(const Pack<B>& p, int q) {
    if constexpr (K == kF32) return __uint_as_float(p.u32[q]);
    else if constexpr (K == kF16) return __half2float(__ushort_as_half(p.u16[q]));
    else return __uint_as_float(static_cast<uint32_t>(p.u16[q]) << 16);  // bfloat16 -> float is exact
  }
  static __device__ __forceinline__ void put(Pack<B>& p, int q, float v) {
    if constexpr (K == kF32) p.u32[q] = __float_as_uint(v);
    else if constexpr (K == kF16) p.u16[q] = __half_as_ushort(__float2half_rn(v));
    else p.u16[q] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
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

struct CombineArgs {
  const char* y;                  // expert_y of this rank [epr, world * M, d]
  const int64_t* src_idx;         // [epr, world * M]
  const int64_t* count;           // [epr, world]
  const int64_t* topk;            // [T, k]
  const float* weights;           // [T, k]
  char* recv[CB_MAX_RANKS];       // every rank's receive area [E, M, d] (offset 0 of its scratch)
  uint32_t* flags[CB_MAX_RANKS];  // every rank's flags: word (sender rank, block)
  char* out;                      // combined_x [T, d]
  int64_t m, tokens, row_bytes;
  int k, epr, world, rank;
  uint32_t epoch;
};

template <int K, int B>
__global__ void __launch_bounds__(kThreads, 1) ll_combine_kernel(const __grid_constant__ CombineArgs a) {
  using Wd = typename Word<B>::type;
  using El = Elems<K, B>;
  __shared__ int32_t start[kMaxSlots + 1];  // start[q]: dense index of the first valid row of slot q
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int G = gridDim.x, b = blockIdx.x;
  const int world = a.world, epr = a.epr, k = a.k;
  const int slots = world * epr;  // slot q = l * world + s, the row-major order of count [epr, world]
  const int64_t m = a.m;
  const int64_t nwords = a.row_bytes / B;

  // 1. prefix of the slot counts: start[q + 1] = rows of slots 0..q
  if (tid == 0) start[0] = 0;
  for (int q = tid; q < slots; q += kThreads) start[q + 1] = static_cast<int32_t>(a.count[q]);
  __syncthreads();
  if (warp == 0) {
    const int per = (slots + 31) / 32;
    const int lo = lane * per, hi = min(lo + per, slots);
    int sum = 0;
    for (int q = lo; q < hi; ++q) sum += start[q + 1];
    int incl = sum;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += v;
    }
    int run = incl - sum;
    for (int q = lo; q < hi; ++q) {
      run += start[q + 1];
      start[q + 1] = run;
    }
  }
  __syncthreads();
  const int64_t total = start[slots];

  // 2. every valid row once into its source's receive area, row (r * epr + l, token)
  {
    const int64_t chunk = 32 * kUnroll;
    const int64_t upr = (nwords + chunk - 1) / chunk;  // units per row
    for (int64_t u = static_cast<int64_t>(b) * kWarps + warp; u < total * upr; u += static_cast<int64_t>(G) * kWarps) {
      const int v = static_cast<int>(u / upr);
      const int64_t w0 = (u - static_cast<int64_t>(v) * upr) * chunk + lane;
      int lo = 0, hi = slots;  // start[lo] <= v < start[hi]
      while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (start[mid] <= v) lo = mid;
        else hi = mid;
      }
      const int q = lo, l = q / world, s = q - l * world;
      const int64_t row = static_cast<int64_t>(q) * m + (v - start[q]);  // row of expert_y [epr * world * M]
      const int64_t tok = __ldg(a.src_idx + row);
      if (tok < 0 || tok >= m) continue;  // never for consistent inputs; warp-uniform
      const Wd* src = reinterpret_cast<const Wd*>(a.y + row * a.row_bytes);
      Wd* dst = reinterpret_cast<Wd*>(a.recv[s] + ((static_cast<int64_t>(a.rank) * epr + l) * m + tok) * a.row_bytes);
      Wd x[kUnroll];
#pragma unroll
      for (int i = 0; i < kUnroll; ++i)
        if (w0 + i * 32 < nwords) x[i] = __ldcs(src + w0 + i * 32);  // read once: evict first
#pragma unroll
      for (int i = 0; i < kUnroll; ++i)
        if (w0 + i * 32 < nwords) dst[w0 + i * 32] = x[i];
    }
  }

  // 3. this block's rows are stored: its done flag (rank, b) on every rank
  __syncthreads();
  if (tid < world) {
    __threadfence_system();
    st_release_sys(a.flags[tid] + a.rank * G + b, a.epoch);
  }

  // 4. every block of every rank has stored its rows here
  for (int q = tid; q < world * G; q += kThreads)
    while (static_cast<int32_t>(ld_acquire_sys(a.flags[a.rank] + q) - a.epoch) < 0) __nanosleep(32);
  __syncthreads();

  // 5. combined_x[i] = sum over valid j of weight[i][j] * recv row (topk[i][j], i), float32, slot order
  {
    const int experts = slots;
    const char* recv = a.recv[a.rank];
    const int64_t upt = (nwords + 31) / 32;  // units per token
    for (int64_t u = static_cast<int64_t>(b) * kWarps + warp; u < a.tokens * upt; u += static_cast<int64_t>(G) * kWarps) {
      const int64_t i = u / upt;
      const int64_t w = (u - i * upt) * 32 + lane;
      if (w >= nwords) continue;  // the last unit of a row: lanes past its end (no warp-wide ops below)
      float acc[El::n];
#pragma unroll
      for (int q = 0; q < El::n; ++q) acc[q] = 0.f;
      for (int j0 = 0; j0 < k; j0 += kBatch) {
        Pack<B> v[kBatch];
        float wt[kBatch];
        bool ok[kBatch];
#pragma unroll
        for (int jj = 0; jj < kBatch; ++jj) {
          const int j = j0 + jj;
          ok[jj] = false;
          wt[jj] = 0.f;
          if (j < k) {
            const int64_t e = __ldg(a.topk + i * k + j);
            if (e >= 0 && e < experts) {
              ok[jj] = true;
              wt[jj] = __ldg(a.weights + i * k + j);
              v[jj].w = __ldcg(reinterpret_cast<const Wd*>(recv + (e * m + i) * a.row_bytes) + w);
            }
          }
        }
#pragma unroll
        for (int jj = 0; jj < kBatch; ++jj)
          if (ok[jj]) {
#pragma unroll
            for (int q = 0; q < El::n; ++q) acc[q] += wt[jj] * El::get(v[jj], q);
          }
      }
      Pack<B> o;
#pragma unroll
      for (int q = 0; q < El::n; ++q) El::put(o, q, acc[q]);
      reinterpret_cast<Wd*>(a.out + i * a.row_bytes)[w] = o.w;
    }
  }
}

// Ranks that share this rank's GPU: all of them (cuda-shared) or one (cuda); every rank computes the same.
int ranks_per_gpu(const cb_args* a) {
  if (a->world < 2) return 1;
  cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, a->peer_flags[(a->rank + 1) % a->world]) != cudaSuccess) {
    (void)cudaGetLastError();
    return a->world;  // unknown: assume the worst
  }
  return at.device == a->device ? a->world : 1;
}

template <int K, int B>
void launch(const CombineArgs& a, int grid, cudaStream_t stream) {
  ll_combine_kernel<K, B><<<grid, kThreads, 0, stream>>>(a);
}

template <int K>
void launch_widest(const CombineArgs& a, int grid, uintptr_t bits, cudaStream_t stream) {
  if ((bits & 15) == 0) launch<K, 16>(a, grid, stream);
  else if ((bits & 7) == 0) launch<K, 8>(a, grid, stream);
  else if ((bits & 3) == 0 || K == kF32) launch<K, 4>(a, grid, stream);
  else if constexpr (K != kF32) launch<K, 2>(a, grid, stream);
}

}  // namespace

CB_ENTRY low_latency_combine(const cb_args* args, cudaStream_t stream) {
  const int world = args->world;
  int kind, esz;
  switch (args->dtype) {
    case CB_FLOAT32: kind = kF32; esz = 4; break;
    case CB_FLOAT16: kind = kF16; esz = 2; break;
    case CB_BFLOAT16: kind = kBF16; esz = 2; break;
    default: return 1;
  }
  const int64_t epr = args->params[0], k = args->params[1];
  if (world < 1 || world > CB_MAX_RANKS || epr < 1 || k < 1 || k > 32 || world * epr > kMaxSlots) return 1;
  const int64_t slots = world * epr;
  if (args->aux_in_count[1] != slots || args->aux_in_count[0] % slots != 0) return 4;
  const int64_t m = args->aux_in_count[0] / slots;  // slot_src_idx [epr, world * M]
  if (m < 1 || m > kMaxTokens || args->count % args->aux_in_count[0] != 0) return 4;
  const int64_t d = args->count / args->aux_in_count[0];
  if (d < 1 || args->aux_in_count[2] % k != 0) return 4;
  const int64_t tokens = args->aux_in_count[2] / k;
  if (tokens > m || args->aux_in_count[3] != tokens * k || args->out_count != tokens * d) return 4;
  const int64_t row_bytes = d * esz;
  if (args->scratch_bytes < slots * m * row_bytes) return 5;

  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  int64_t grid = sms / ranks_per_gpu(args);
  if (grid > args->flag_words / world) grid = args->flag_words / world;
  if (grid < 1) return 5;

  CombineArgs a{};
  a.y = static_cast<const char*>(args->in);
  a.src_idx = static_cast<const int64_t*>(args->aux_in[0]);
  a.count = static_cast<const int64_t*>(args->aux_in[1]);
  a.topk = static_cast<const int64_t*>(args->aux_in[2]);
  a.weights = static_cast<const float*>(args->aux_in[3]);
  uintptr_t bits = static_cast<uintptr_t>(row_bytes) | reinterpret_cast<uintptr_t>(args->in);
  if (tokens > 0) bits |= reinterpret_cast<uintptr_t>(args->out);
  for (int p = 0; p < world; ++p) {
    a.recv[p] = static_cast<char*>(args->peer_scratch[p]);
    a.flags[p] = args->peer_flags[p];
    bits |= reinterpret_cast<uintptr_t>(args->peer_scratch[p]);
  }
  a.out = static_cast<char*>(args->out);
  a.m = m;
  a.tokens = tokens;
  a.row_bytes = row_bytes;
  a.k = static_cast<int>(k);
  a.epr = static_cast<int>(epr);
  a.world = world;
  a.rank = args->rank;
  a.epoch = args->epoch;

  // the widest word that divides the row size, expert_y, combined_x and every rank's receive area
  const int g = static_cast<int>(grid);
  if (kind == kF32) launch_widest<kF32>(a, g, bits, stream);
  else if (kind == kF16) launch_widest<kF16>(a, g, bits, stream);
  else launch_widest<kBF16>(a, g, bits, stream);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
