// Reference: one-shot all-reduce. Every rank reads the same 16-byte word from all ranks' inputs, adds the
// words in float32 in rank order (so every rank produces bit-identical sums) and writes its own output.
// Each rank moves (world - 1) x the tensor over the links, but needs no flags and no second step, which is
// what wins for small messages where latency, not bandwidth, dominates.
#include "commbench.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 512;

template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// N elements loaded and stored as one access (16 bytes when N * sizeof(T) == 16).
template <typename T, int N> struct alignas(sizeof(T) * N) Pack { T v[N]; };

struct Sources { const void* p[CB_MAX_RANKS]; };

// dst[e .. e+N) = sum over ranks of src[rank][e .. e+N), accumulated in float32 in rank order.
template <typename T, int N>
__device__ __forceinline__ void sum_pack(const Sources& src, int world, int64_t e, T* dst) {
  using P = Pack<T, N>;
  P in[CB_MAX_RANKS];
#pragma unroll
  for (int p = 0; p < CB_MAX_RANKS; ++p)  // all loads first: up to `world` remote reads in flight
    if (p < world) in[p] = *reinterpret_cast<const P*>(static_cast<const T*>(src.p[p]) + e);
  float acc[N];
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = to_float(in[0].v[i]);
#pragma unroll
  for (int p = 1; p < CB_MAX_RANKS; ++p)
    if (p < world) {
#pragma unroll
      for (int i = 0; i < N; ++i) acc[i] += to_float(in[p].v[i]);
    }
  P out;
#pragma unroll
  for (int i = 0; i < N; ++i) out.v[i] = from_float<T>(acc[i]);
  *reinterpret_cast<P*>(dst + e) = out;
}

template <typename T, int N>
__global__ void __launch_bounds__(kThreads) oneshot_kernel(const __grid_constant__ Sources src, T* dst, int world,
                                                           int64_t n) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t nthreads = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t packs = n / N;
  for (int64_t k = tid; k < packs; k += nthreads) sum_pack<T, N>(src, world, k * N, dst);
  for (int64_t e = packs * N + tid; e < n; e += nthreads) sum_pack<T, 1>(src, world, e, dst);  // tail
}

template <typename T>
int launch(const cb_args* a, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  Sources src{};
  bool aligned = (reinterpret_cast<uintptr_t>(a->out) & 15) == 0;
  for (int p = 0; p < a->world; ++p) {
    src.p[p] = a->peer_in[p];
    aligned = aligned && (reinterpret_cast<uintptr_t>(a->peer_in[p]) & 15) == 0;
  }
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, a->device) != cudaSuccess) return 2;
  const int vec = aligned ? kVec : 1;
  int64_t blocks = (a->count / vec + kThreads - 1) / kThreads;
  if (blocks > 4 * sms) blocks = 4 * sms;
  if (blocks < 1) blocks = 1;
  T* dst = static_cast<T*>(a->out);
  if (aligned)
    oneshot_kernel<T, kVec><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(src, dst, a->world, a->count);
  else
    oneshot_kernel<T, 1><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(src, dst, a->world, a->count);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}

}  // namespace

CB_ENTRY all_reduce(const cb_args* args, cudaStream_t stream) {
  if (args->count <= 0) return 0;
  if (args->world < 1 || args->world > CB_MAX_RANKS) return 1;
  switch (args->dtype) {
    case CB_FLOAT32: return launch<float>(args, stream);
    case CB_FLOAT16: return launch<__half>(args, stream);
    case CB_BFLOAT16: return launch<__nv_bfloat16>(args, stream);
    default: return 1;
  }
}
