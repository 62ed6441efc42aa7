// Reference: weighted top-k combine by pulling expert outputs through peer pointers (the combine of DeepEP).
//
// Entry (s, i, j) = slot j of token i of rank s. Its expert e lives on rank r = e / experts_per_rank, whose
// expert_out holds the rows of all entries routed to r in the order (s, i, j), the rows of rank s starting at
// rank_offsets[s][r]. So the row of entry (i, j) of this rank is
//   rank_offsets[rank][r] + (entries of this rank before (i, j), in row-major order, whose expert is on r).
//   1. index (1 block of 1024 threads): one thread per entry; a ballot per rank and a scan over the 32 warps give
//      the entry's position among this rank's entries for the same rank, continued across rounds by a carry
//      that starts at rank_offsets[rank][r]. It stores (row << 3) | r per entry in scratch (-1 when masked).
//   2. combine (grid-stride, up to 4 blocks per SM): one thread per 16-byte pack of the output (8 bfloat16 or 4
//      float32 elements, one element when d or an address does not allow packs): it issues the loads of the pack
//      from up to 8 entries' rows at once (remote reads straight from the owners' memory, all in flight), then
//      accumulates weight * row in float32 in slot order and rounds once. Tokens routed nowhere get zeros.
// The expert outputs are complete before any call starts and each rank writes only its own output: no flags.
#include "commbench.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kIndexThreads = 1024;
constexpr int kIndexWarps = kIndexThreads / 32;
constexpr int kThreads = 512;
constexpr int kBatch = 8;  // entries whose loads are in flight together
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

struct IndexArgs {
  const int64_t* topk;          // [T, k]
  const int32_t* rank_offsets;  // [world, world]
  int32_t* entry;               // scratch [T, k]: (row << 3) | owner, -1 when masked
  int64_t entries;              // T * k
  int epr, world, rank;
};

__global__ void __launch_bounds__(kIndexThreads) index_kernel(const __grid_constant__ IndexArgs a) {
  __shared__ int warp_base[kIndexWarps][CB_MAX_RANKS];
  __shared__ int carry[CB_MAX_RANKS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned below = (1u << lane) - 1u;
  if (tid < CB_MAX_RANKS) carry[tid] = tid < a.world ? a.rank_offsets[a.rank * a.world + tid] : 0;
  __syncthreads();
  for (int64_t base = 0; base < a.entries; base += kIndexThreads) {  // the same rounds for every thread
    const int64_t q = base + tid;
    int owner = -1;
    if (q < a.entries) {
      const int64_t e = a.topk[q];
      if (e >= 0 && e < static_cast<int64_t>(a.world) * a.epr) owner = static_cast<int>(e / a.epr);
    }
    int pre = 0;
#pragma unroll
    for (int r = 0; r < CB_MAX_RANKS; ++r) {
      const unsigned b = __ballot_sync(kFull, owner == r);
      if (owner == r) pre = __popc(b & below);
      if (lane == 0) warp_base[warp][r] = __popc(b);
    }
    __syncthreads();
    if (tid < a.world) {
      int run = carry[tid];
      for (int w = 0; w < kIndexWarps; ++w) {
        const int t = warp_base[w][tid];
        warp_base[w][tid] = run;
        run += t;
      }
      carry[tid] = run;
    }
    __syncthreads();
    if (q < a.entries) a.entry[q] = owner >= 0 ? ((warp_base[warp][owner] + pre) << 3) | owner : -1;
    __syncthreads();
  }
}

template <typename T>
struct CombineArgs {
  const T* src[CB_MAX_RANKS];   // every rank's expert_out
  const int32_t* entry;         // [T, k], from index_kernel
  const float* weights;         // [T, k]
  T* out;                       // [T, d]
  int64_t tokens, d;
  int k;
};

template <typename T, int N>
__global__ void __launch_bounds__(kThreads) combine_kernel(const __grid_constant__ CombineArgs<T> a) {
  using P = Pack<T, N>;
  const int64_t packs = a.d / N;
  const int64_t total = a.tokens * packs;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; q < total;
       q += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t i = q / packs;
    const int64_t c = (q - i * packs) * N;  // first element of the pack in the row
    const int32_t* ent = a.entry + i * a.k;
    const float* wt = a.weights + i * a.k;
    float acc[N];
#pragma unroll
    for (int n = 0; n < N; ++n) acc[n] = 0.f;
    for (int j0 = 0; j0 < a.k; j0 += kBatch) {
      P v[kBatch];
      float w[kBatch];
      bool ok[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {  // all loads first
        const int j = j0 + u;
        const int32_t e = j < a.k ? ent[j] : -1;
        ok[u] = e >= 0;
        w[u] = 0.f;
        if (ok[u]) {
          v[u] = *reinterpret_cast<const P*>(a.src[e & 7] + static_cast<int64_t>(e >> 3) * a.d + c);
          w[u] = wt[j];
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if (ok[u]) {
#pragma unroll
          for (int n = 0; n < N; ++n) acc[n] += w[u] * to_float(v[u].v[n]);
        }
    }
    P o;
#pragma unroll
    for (int n = 0; n < N; ++n) o.v[n] = from_float<T>(acc[n]);
    *reinterpret_cast<P*>(a.out + i * a.d + c) = o;
  }
}

template <typename T>
int launch(const cb_args* args, const IndexArgs& ix, int64_t tokens, int64_t d, int k, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  CombineArgs<T> c{};
  bool aligned = d % kVec == 0 && (reinterpret_cast<uintptr_t>(args->out) & 15) == 0;
  for (int p = 0; p < args->world; ++p) {
    c.src[p] = static_cast<const T*>(args->peer_in[p]);
    aligned = aligned && (reinterpret_cast<uintptr_t>(args->peer_in[p]) & 15) == 0;
  }
  c.entry = ix.entry;
  c.weights = static_cast<const float*>(args->aux_in[1]);
  c.out = static_cast<T*>(args->out);
  c.tokens = tokens;
  c.d = d;
  c.k = k;
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  const int vec = aligned ? kVec : 1;
  int64_t blocks = (tokens * (d / vec) + kThreads - 1) / kThreads;
  if (blocks > 4 * sms) blocks = 4 * sms;
  if (blocks < 1) blocks = 1;
  index_kernel<<<1, kIndexThreads, 0, stream>>>(ix);
  if (aligned)
    combine_kernel<T, kVec><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(c);
  else
    combine_kernel<T, 1><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(c);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}

}  // namespace

CB_ENTRY combine(const cb_args* args, cudaStream_t stream) {
  const int world = args->world;
  const int64_t epr = args->params[0], k = args->params[1];
  if (world < 1 || world > CB_MAX_RANKS || epr < 1 || k < 1) return 1;
  if (args->aux_in_count[0] % k != 0) return 4;
  const int64_t tokens = args->aux_in_count[0] / k;
  if (tokens < 1 || args->out_count % tokens != 0) return 4;
  const int64_t d = args->out_count / tokens;
  if (args->aux_in_count[1] != tokens * k || args->aux_in_count[2] != world * world || args->count % d != 0) return 4;
  if (static_cast<int64_t>(world) * tokens * k >= (int64_t{1} << 28)) return 4;  // rows must fit (row << 3) in int32
  if (tokens * k * 4 > args->scratch_bytes) return 6;

  IndexArgs ix{};
  ix.topk = static_cast<const int64_t*>(args->aux_in[0]);
  ix.rank_offsets = static_cast<const int32_t*>(args->aux_in[2]);
  ix.entry = static_cast<int32_t*>(args->scratch);
  ix.entries = tokens * k;
  ix.epr = static_cast<int>(epr);
  ix.world = world;
  ix.rank = args->rank;
  switch (args->dtype) {
    case CB_FLOAT32: return launch<float>(args, ix, tokens, d, static_cast<int>(k), stream);
    case CB_FLOAT16: return launch<__half>(args, ix, tokens, d, static_cast<int>(k), stream);
    case CB_BFLOAT16: return launch<__nv_bfloat16>(args, ix, tokens, d, static_cast<int>(k), stream);
    default: return 1;
  }
}
