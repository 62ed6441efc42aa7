// Reference: RMSNorm of q and k over all heads of a token, the heads sharded across ranks, fused with the
// exchange of the partial sums of squares (one kernel per rank, no separate all-reduce).
//
// Rank r holds q_r [T, Dq] and k_r [T, Dk]: its heads of every token. The norm of token t needs
// Sq[t] = sum over ranks of sum_j q_r[t, j]^2 (and Sk[t]), so each rank contributes two floats per token and
// needs every other rank's two. The kernel works on tiles of RT consecutive tokens (RT * (Dq + Dk) elements, at
// most 64 KiB); block b of every rank owns tiles b, b + G, b + 2G, ... (G and RT depend only on sizes that all
// ranks share, so block b of rank r and block b of rank p own the same tokens). Per tile:
//   1. load: the tile's q and k rows (contiguous ranges of q and k) with 16-byte loads, 8 per thread in flight,
//      into a shared-memory stage; the per-token partial sums of squares are accumulated on the way (a warp
//      whose 32 packs belong to one token reduces by shuffles and adds once to shared memory);
//   2. publish: one thread per token writes {Sq_r, epoch, Sk_r, epoch} (16 bytes, one v4 store) into slot
//      [r][t] of every peer's scratch: the LL protocol, each 8-byte half carries its own flag, so no fence and
//      no separate flag word are needed;
//   3. wait: one thread per token polls slot [p][t] of its own scratch for every peer p until both flags of
//      the line hold this call's epoch, and sums the partials in rank order 0 .. world-1 (the same float sum on
//      every rank), giving rsqrt(S / (world * D) + eps);
//   4. store: every element of the stage times its token's factor and its column's weight, to the outputs.
// Two stages alternate: tile i+1 is loaded and published BEFORE the block waits for tile i, so the flag round
// trip of tile i overlaps the loads of tile i+1, and q/k are read from HBM exactly once.
//
// Bound (cuda-shared, HBM bytes). With B = T * (Dq + Dk) * element size (the metric's size), every rank must read
// B and write B; the exchange adds 16 * (world - 1) bytes per token each way (0.3 % of a 10 KiB bf16 row). That is
// exactly a copy of B per rank, so the judge's copy roofline (C / world per rank) is the bound: target >= 70 % of
// it at 64 MiB. Expected about 75-85 %: two 64 KiB stages per SM keep 64 KiB of loads in flight per SM, and the
// only serialisation per tile is the barrier between its load and its stores.
//
// Deadlock freedom: a block publishes tile i+1 after waiting for tile i-1 only; tile i-1 was published by every
// peer's block b before it waited for anything newer, so by induction every wait ends, provided block b of every
// rank runs at the same time. The kernel uses 136 KiB of shared memory (one block per SM) and when the ranks
// share a GPU G = SMs / world, so all blocks of all ranks are resident together.
// Flags: slots are never reset; a slot written in an earlier call holds an older epoch and never matches. The
// judge synchronises every device between calls, so no slot is overwritten while it is still read.
#include "commbench.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

namespace {

constexpr int kThreads = 512;
constexpr int kStageBytes = 64 * 1024;  // one tile of q and k rows
constexpr int kMaxRows = kThreads;      // tokens per tile: one thread per token in steps 2 and 3
constexpr int kBatch = 8;               // loads in flight per thread (8 x 16 B x 512 threads = one 64 KiB stage)
constexpr int kPartFloats = 2 * kMaxRows;  // per stage: q partials [0, kMaxRows), k partials [kMaxRows, 2 kMaxRows)
constexpr int kSmemBytes = 2 * kStageBytes + 2 * kPartFloats * static_cast<int>(sizeof(float));
constexpr unsigned kFull = 0xffffffffu;

template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T, int N> struct alignas(sizeof(T) * N) Pack { T v[N]; };

// Read-once load: 16-byte packs with the streaming hint, smaller ones plainly.
template <typename P> __device__ __forceinline__ P load_once(const P* p) {
  if constexpr (sizeof(P) == 16) {
    const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p));
    P r;
    memcpy(&r, &v, sizeof(P));
    return r;
  } else {
    return *p;
  }
}

// Load through the read-only path (the weights: every tile rereads them, from L1/L2).
template <typename P> __device__ __forceinline__ P load_ro(const P* p) {
  if constexpr (sizeof(P) == 16) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    P r;
    memcpy(&r, &v, sizeof(P));
    return r;
  } else {
    return *p;
  }
}

// One LL line: two 8-byte halves {value, epoch}, each written and read as a unit.
__device__ __forceinline__ void st_line(uint4* p, float a, float b, uint32_t epoch) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(__float_as_uint(a)), "r"(epoch),
               "r"(__float_as_uint(b)), "r"(epoch)
               : "memory");
}

__device__ __forceinline__ uint4 ld_line(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// Add v to part[idx] (idx -1: nothing). Called by all 32 lanes; lanes hold consecutive packs, so idx never
// decreases along the lanes (q rows, then k rows at kMaxRows + row, then -1 past the tile): when the first and the
// last lane agree, the whole warp agrees.
__device__ __forceinline__ void add_partial(float* part, int idx, float v) {
  const int first = __shfl_sync(kFull, idx, 0);
  const int last = __shfl_sync(kFull, idx, 31);
  if (first == last) {
    if (first >= 0) {
      v = warp_sum(v);
      if ((threadIdx.x & 31) == 0) atomicAdd(part + first, v);
    }
  } else if (idx >= 0) {
    atomicAdd(part + idx, v);
  }
}

struct QkArgs {
  const void* q;        // [T, Dq]
  const void* k;        // [T, Dk]
  const void* wq;       // [Dq]
  const void* wk;       // [Dk]
  void* q_out;          // [T, Dq]
  void* k_out;          // [T, Dk]
  uint4* slots[CB_MAX_RANKS];  // every rank's scratch: line [src * T + t]
  int64_t tokens;
  int64_t qp, kp;       // packs per q row, per k row
  int64_t rows_per_tile;
  int64_t tiles;
  float inv_nq, inv_nk;  // 1 / (world * Dq), 1 / (world * Dk)
  float eps;
  int rank;
  int world;
  uint32_t epoch;
};

// Steps 1 and 2 for one tile into one stage.
template <typename T, int N>
__device__ __forceinline__ void load_publish(const QkArgs& a, int64_t tile, Pack<T, N>* data, float* part) {
  using P = Pack<T, N>;
  const int tid = threadIdx.x;
  const int64_t t0 = tile * a.rows_per_tile;
  const int rows = static_cast<int>(min(a.rows_per_tile, a.tokens - t0));
  // tile-local pack indices fit in 32 bits (a stage holds at most 32768 elements): cheap divisions
  const uint32_t qp = static_cast<uint32_t>(a.qp), kp = static_cast<uint32_t>(a.kp);
  const uint32_t nq = rows * qp, n = nq + rows * kp;
  const P* gq = static_cast<const P*>(a.q) + t0 * a.qp;
  const P* gk = static_cast<const P*>(a.k) + t0 * a.kp;
  __syncthreads();  // the previous user of this stage (the stores of two tiles ago) is done
  for (int i = tid; i < kPartFloats; i += kThreads) part[i] = 0.f;
  __syncthreads();
  for (uint32_t base = 0; base < n; base += kThreads * kBatch) {  // block-uniform trip count
    P v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const uint32_t p = base + u * kThreads + tid;
      if (p < nq) v[u] = load_once(gq + p);
      else if (p < n) v[u] = load_once(gk + (p - nq));
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const uint32_t p = base + u * kThreads + tid;
      int idx = -1;
      float ss = 0.f;
      if (p < n) {
        idx = p < nq ? static_cast<int>(p / qp) : kMaxRows + static_cast<int>((p - nq) / kp);
#pragma unroll
        for (int i = 0; i < N; ++i) {
          const float f = to_float(v[u].v[i]);
          ss += f * f;
        }
        data[p] = v[u];
      }
      add_partial(part, idx, ss);
    }
  }
  __syncthreads();  // partials and stage complete
  if (tid < rows) {
    const float sq = part[tid], sk = part[kMaxRows + tid];
    const int64_t line = static_cast<int64_t>(a.rank) * a.tokens + t0 + tid;
    for (int p = 0; p < a.world; ++p)
      if (p != a.rank) st_line(a.slots[p] + line, sq, sk, a.epoch);
  }
}

// Steps 3 and 4 for one tile from one stage.
template <typename T, int N>
__device__ __forceinline__ void wait_store(const QkArgs& a, int64_t tile, const Pack<T, N>* data, float* part) {
  using P = Pack<T, N>;
  const int tid = threadIdx.x;
  const int64_t t0 = tile * a.rows_per_tile;
  const int rows = static_cast<int>(min(a.rows_per_tile, a.tokens - t0));
  if (tid < rows) {
    float tq = 0.f, tk = 0.f;
    for (int p = 0; p < a.world; ++p) {  // rank order: every rank forms the same sums
      if (p == a.rank) {
        tq += part[tid];
        tk += part[kMaxRows + tid];
      } else {
        const uint4* line = a.slots[a.rank] + static_cast<int64_t>(p) * a.tokens + t0 + tid;
        uint4 v = ld_line(line);
        while (v.y != a.epoch || v.w != a.epoch) v = ld_line(line);
        tq += __uint_as_float(v.x);
        tk += __uint_as_float(v.z);
      }
    }
    part[tid] = rsqrtf(tq * a.inv_nq + a.eps);
    part[kMaxRows + tid] = rsqrtf(tk * a.inv_nk + a.eps);
  }
  __syncthreads();
  const uint32_t qp = static_cast<uint32_t>(a.qp), kp = static_cast<uint32_t>(a.kp);
  const uint32_t nq = rows * qp, n = nq + rows * kp;
  const P* wq = static_cast<const P*>(a.wq);
  const P* wk = static_cast<const P*>(a.wk);
  P* oq = static_cast<P*>(a.q_out) + t0 * a.qp;
  P* ok = static_cast<P*>(a.k_out) + t0 * a.kp;
  for (uint32_t p = tid; p < n; p += kThreads) {
    const bool is_q = p < nq;
    const uint32_t pp = is_q ? p : p - nq;
    const uint32_t per_row = is_q ? qp : kp;
    const uint32_t row = pp / per_row;
    const float s = part[(is_q ? 0 : kMaxRows) + row];
    const P w = load_ro((is_q ? wq : wk) + (pp - row * per_row));
    const P x = data[p];
    P o;
#pragma unroll
    for (int i = 0; i < N; ++i) o.v[i] = from_float<T>(to_float(x.v[i]) * s * to_float(w.v[i]));
    (is_q ? oq : ok)[pp] = o;
  }
}

template <typename T, int N>
__global__ void __launch_bounds__(kThreads, 1) qk_norm_kernel(const __grid_constant__ QkArgs a) {
  using P = Pack<T, N>;
  extern __shared__ __align__(16) unsigned char smem[];
  // stage s: its tile at smem + s * kStageBytes, its partials after both tiles
  auto data = [&](int st) { return reinterpret_cast<P*>(smem + st * kStageBytes); };
  auto part = [&](int st) { return reinterpret_cast<float*>(smem + 2 * kStageBytes) + st * kPartFloats; };
  int64_t tile = blockIdx.x;  // grid <= tiles: every block owns at least one tile
  int s = 0;
  load_publish<T, N>(a, tile, data(0), part(0));
  for (;;) {
    const int64_t next = tile + gridDim.x;
    if (next < a.tiles) load_publish<T, N>(a, next, data(s ^ 1), part(s ^ 1));
    wait_store<T, N>(a, tile, data(s), part(s));
    if (next >= a.tiles) break;
    tile = next;
    s ^= 1;
  }
}


// Ranks that share this rank's GPU: either all of them (cuda-shared) or one (cuda); every rank gets the same.
int ranks_per_gpu(const cb_args* a) {
  if (a->world < 2) return 1;
  cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, a->peer_scratch[(a->rank + 1) % a->world]) != cudaSuccess) {
    (void)cudaGetLastError();
    return a->world;  // unknown: assume the worst
  }
  return at.device == a->device ? a->world : 1;
}

template <typename T, int N>
int launch_kernel(const QkArgs& k, int64_t grid, cudaStream_t stream) {
  if (cudaFuncSetAttribute(qk_norm_kernel<T, N>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) !=
      cudaSuccess)
    return 3;
  qk_norm_kernel<T, N><<<static_cast<unsigned>(grid), kThreads, kSmemBytes, stream>>>(k);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}

template <typename T>
int launch(const cb_args* a, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t dq = a->aux_in_count[1], dk = a->aux_in_count[2];
  if (dq < 1 || dk < 1 || a->count % dq != 0) return 4;
  const int64_t tokens = a->count / dq;
  if (tokens < 1 || a->aux_in_count[0] != tokens * dk || a->out_count != tokens * dq ||
      a->aux_out_count[0] != tokens * dk)
    return 4;
  const int64_t row_bytes = (dq + dk) * static_cast<int64_t>(sizeof(T));
  if (row_bytes > kStageBytes) return 4;  // wider than the prompt allows
  if (a->scratch_bytes < static_cast<int64_t>(a->world) * tokens * 16) return 5;

  QkArgs k{};
  k.q = a->in;
  k.k = a->aux_in[0];
  k.wq = a->aux_in[1];
  k.wk = a->aux_in[2];
  k.q_out = a->out;
  k.k_out = a->aux_out[0];
  for (int p = 0; p < a->world; ++p) k.slots[p] = static_cast<uint4*>(a->peer_scratch[p]);
  k.tokens = tokens;
  k.rows_per_tile = kStageBytes / row_bytes;
  if (k.rows_per_tile > kMaxRows) k.rows_per_tile = kMaxRows;
  k.tiles = (tokens + k.rows_per_tile - 1) / k.rows_per_tile;
  k.inv_nq = static_cast<float>(1.0 / (static_cast<double>(a->world) * static_cast<double>(dq)));
  k.inv_nk = static_cast<float>(1.0 / (static_cast<double>(a->world) * static_cast<double>(dk)));
  k.eps = static_cast<float>(static_cast<double>(a->params[0]) * 1e-9);
  k.rank = a->rank;
  k.world = a->world;
  k.epoch = a->epoch;

  // G from values every rank shares: one block per SM (136 KiB of shared memory), the SMs split between the ranks
  // of a GPU, never more blocks than tiles.
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, a->device) != cudaSuccess) return 2;
  int64_t grid = sms / ranks_per_gpu(a);
  if (grid > k.tiles) grid = k.tiles;
  if (grid < 1) return 5;

  const uintptr_t bits = reinterpret_cast<uintptr_t>(a->in) | reinterpret_cast<uintptr_t>(a->aux_in[0]) |
                         reinterpret_cast<uintptr_t>(a->aux_in[1]) | reinterpret_cast<uintptr_t>(a->aux_in[2]) |
                         reinterpret_cast<uintptr_t>(a->out) | reinterpret_cast<uintptr_t>(a->aux_out[0]);
  if (dq % kVec == 0 && dk % kVec == 0 && (bits & 15) == 0) {
    k.qp = dq / kVec;
    k.kp = dk / kVec;
    return launch_kernel<T, kVec>(k, grid, stream);
  }
  k.qp = dq;
  k.kp = dk;
  return launch_kernel<T, 1>(k, grid, stream);
}

}  // namespace

CB_ENTRY qk_norm(const cb_args* args, cudaStream_t stream) {
  if (args->world < 1 || args->world > CB_MAX_RANKS) return 1;
  switch (args->dtype) {
    case CB_FLOAT32: return launch<float>(args, stream);
    case CB_FLOAT16: return launch<__half>(args, stream);
    case CB_BFLOAT16: return launch<__nv_bfloat16>(args, stream);
    default: return 1;
  }
}
