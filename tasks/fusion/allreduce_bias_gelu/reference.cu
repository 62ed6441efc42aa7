// Reference: the epilogue of a row-parallel linear layer, y = gelu(sum_r x_r + bias), fused with its all-reduce
// in ONE kernel per rank and ONE pass over memory, with no flags.
//
// The epilogue is element-wise (no statistic over a row), so the work can be cut anywhere: the full 16-byte
// vectors of the flat tensor are split into `world` contiguous ranges, and rank r owns range r (the last rank also
// the count % vector-width elements past the last full vector). For every vector it owns, a rank loads that
// vector of every rank's x (peer_in, in rank order, float32 sums), adds the bias (column = flat index mod d),
// applies the exact GELU once, rounds once, and stores the result into that vector of EVERY rank's out
// (peer_out): a reduce-scatter and an all-gather in one pass, with the epilogue computed once per element instead
// of world times. No rank waits for another: the judge synchronises every device before the call (every x is
// complete, every out NaN-filled) and after it (every push has landed), and no two ranks write the same element.
//
// Bound (cuda-shared, HBM bytes): every x is read once and every out written once, 2 * world * B bytes of traffic
// for B = the bytes of x, i.e. world * B "copied" at the device copy rate C: t >= world * B / C. busbw = B / t *
// 2 (world - 1) / world is then at most 2 (world - 1) / world of the per-rank roofline C / world: 100 % at
// world 2, more at larger worlds (the one-GPU emulation lets ranks share HBM without a link in between). The
// target is >= 70 % of the per-rank copy roofline at 64 MiB at every world size (a streaming kernel with 16-byte
// accesses, 2 vectors of up to 4 ranks in flight per thread, 4 blocks of 256 threads per SM over all ranks).
// With one GPU per rank each rank reads (world - 1) / world of B from its peers and writes as much to them, the
// all-reduce's link-bound traffic.
#include "commbench.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 2;  // vectors per thread per iteration
constexpr int kRankBatch = 4;  // ranks whose loads are in flight together (registers: 2 x 4 x 16 bytes)

template <typename T> struct Traits;
template <> struct Traits<float> {
  static constexpr int kVec = 4;
  static __device__ __forceinline__ float to_f(float v) { return v; }
  static __device__ __forceinline__ float from_f(float v) { return v; }
};
template <> struct Traits<__nv_bfloat16> {
  static constexpr int kVec = 8;
  static __device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from_f(float v) { return __float2bfloat16_rn(v); }
};

template <typename T, int N> struct alignas(16) Pack { T v[N]; };

template <typename P> __device__ __forceinline__ P load_stream(const void* base, int64_t idx) {  // read once
  const uint4 r = __ldcs(static_cast<const uint4*>(base) + idx);
  return *reinterpret_cast<const P*>(&r);
}

__device__ __forceinline__ float gelu(float h) {  // h * Phi(h); erfc keeps the negative tail accurate
  return 0.5f * h * erfcf(-0.70710678118654752f * h);
}

struct Args {
  const void* x[CB_MAX_RANKS];  // every rank's x
  void* y[CB_MAX_RANKS];        // every rank's out
  const void* bias;             // this rank's copy
  int64_t count;
  int64_t v0, v1;               // the full vectors this rank owns
  int64_t tail0;                // first element past the last full vector (the last rank finishes them)
  uint32_t d;
  int world;
  bool last;
};

template <typename T, bool kBiasVec>
__global__ void __launch_bounds__(kThreads) bias_gelu_kernel(const __grid_constant__ Args a) {
  using Tr = Traits<T>;
  constexpr int V = Tr::kVec;
  using P = Pack<T, V>;
  const T* bias = static_cast<const T*>(a.bias);
  const int64_t gtid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t gthreads = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t j = a.v0 + gtid; j < a.v1; j += gthreads * kUnroll) {
    float acc[kUnroll][V];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int e = 0; e < V; ++e) acc[u][e] = 0.f;  // 0 + x_0 == x_0: still the sum in rank order
#pragma unroll
    for (int p0 = 0; p0 < CB_MAX_RANKS; p0 += kRankBatch) {
      if (p0 >= a.world) break;
      P v[kRankBatch][kUnroll];
#pragma unroll
      for (int q = 0; q < kRankBatch; ++q)
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t idx = j + u * gthreads;
          if (p0 + q < a.world && idx < a.v1) v[q][u] = load_stream<P>(a.x[p0 + q], idx);
        }
#pragma unroll
      for (int q = 0; q < kRankBatch; ++q)
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (p0 + q < a.world) {
#pragma unroll
            for (int e = 0; e < V; ++e) acc[u][e] += Tr::to_f(v[q][u].v[e]);
          }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t idx = j + u * gthreads;
      if (idx >= a.v1) break;
      uint32_t col = static_cast<uint32_t>(idx) * V % a.d;  // count < 2^31
      P out;
      if constexpr (kBiasVec) {  // d is a multiple of V: the vector's columns are col .. col + V - 1
        const P b = *reinterpret_cast<const P*>(bias + col);
#pragma unroll
        for (int e = 0; e < V; ++e) out.v[e] = Tr::from_f(gelu(acc[u][e] + Tr::to_f(b.v[e])));
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) {
          out.v[e] = Tr::from_f(gelu(acc[u][e] + Tr::to_f(bias[col])));
          col = col + 1 == a.d ? 0u : col + 1;
        }
      }
#pragma unroll 1
      for (int p = 0; p < a.world; ++p) *(reinterpret_cast<P*>(a.y[p]) + idx) = out;
    }
  }
  if (a.last) {  // fewer than V elements past the last full vector
    const int64_t i = a.tail0 + gtid;
    if (i < a.count) {
      float h = 0.f;
      for (int p = 0; p < a.world; ++p) h += Tr::to_f(static_cast<const T*>(a.x[p])[i]);
      const T y = Tr::from_f(gelu(h + Tr::to_f(bias[static_cast<uint32_t>(i) % a.d])));
      for (int p = 0; p < a.world; ++p) static_cast<T*>(a.y[p])[i] = y;
    }
  }
}

int ranks_per_gpu(const cb_args* a) {
  if (a->world < 2) return 1;
  cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, a->peer_in[(a->rank + 1) % a->world]) != cudaSuccess) {
    (void)cudaGetLastError();
    return a->world;
  }
  return at.device == a->device ? a->world : 1;
}

template <typename T>
int launch(const cb_args* args, Args& a, cudaStream_t stream) {
  constexpr int V = Traits<T>::kVec;
  const int64_t nvec = a.count / V;
  a.v0 = nvec * args->rank / a.world;
  a.v1 = nvec * (args->rank + 1) / a.world;
  a.tail0 = nvec * V;
  a.last = args->rank == a.world - 1;
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  int64_t grid = (a.v1 - a.v0 + static_cast<int64_t>(kThreads) * kUnroll - 1) / (static_cast<int64_t>(kThreads) * kUnroll);
  const int64_t cap = static_cast<int64_t>(sms) * 4 / ranks_per_gpu(args);  // no block waits: any grid is safe
  if (grid > cap) grid = cap;
  if (grid < 1) grid = 1;  // the tail
  if (a.d % V == 0) bias_gelu_kernel<T, true><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(a);
  else bias_gelu_kernel<T, false><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(a);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}

}  // namespace

CB_ENTRY allreduce_bias_gelu(const cb_args* args, cudaStream_t stream) {
  const int world = args->world;
  const int64_t d = args->aux_in_count[0];
  if (world < 1 || world > CB_MAX_RANKS || d < 1 || d > 0x7fffffff) return 1;
  if (args->count < 1 || args->count > 0x7fffffff || args->count % d != 0 || args->out_count != args->count) return 4;
  Args a{};
  for (int p = 0; p < world; ++p) {
    if (args->peer_in[p] == nullptr || args->peer_out[p] == nullptr) return 1;
    a.x[p] = args->peer_in[p];
    a.y[p] = args->peer_out[p];
  }
  a.bias = args->aux_in[0];
  a.count = args->count;
  a.d = static_cast<uint32_t>(d);
  a.world = world;
  if (args->dtype == CB_BFLOAT16) return launch<__nv_bfloat16>(args, a, stream);
  if (args->dtype == CB_FLOAT32) return launch<float>(args, a, stream);
  return 1;
}
