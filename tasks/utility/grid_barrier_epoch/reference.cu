// Reference: the whole power iteration in ONE kernel launch per rank, one grid-wide barrier per round.
//
// Round k (y_0 = x; W0 / W1 are two n-element buffers in scratch, part[2][kMaxBlocks] the blocks' maxima):
//   1. every thread takes 16-byte vectors of y_k (= x at k = 0, else W[(k-1) % 2] * (1 / m_{k-1})); the
//      neighbours y[i-1] and y[i+1] of a vector's ends come from the adjacent lanes by warp shuffle (lanes hold
//      consecutive vectors), and from global memory only at the warp's two ends;
//   2. it writes w = lower*y[i-1] + diag*y[i] + upper*y[i+1] into W[k % 2] and keeps the largest |w|; the block's
//      largest goes into part[k % 2][block];
//   3. grid barrier; then every block reads all G maxima of part[k % 2] (m_k) and goes on to round k + 1.
// After the last round every block writes out = W[(R-1) % 2] / m_{R-1} for its vectors.
//
// Why one barrier per round is enough: W[k % 2] and part[k % 2] are written in round k and read in round k + 1
// (after barrier k); they are written again only in round k + 2, i.e. after barrier k + 1, which no block passes
// before every block has finished round k + 1 and with it its reads of W[k % 2] and part[k % 2].
//
// The barrier is a single 32-bit word in scratch that is never reset. Each block's thread 0 adds 1 to it, except
// block 0, which adds 0x80000000 - (G - 1): a complete barrier adds exactly 0x80000000, so the word's low 31 bits
// are 0 again after every barrier (they are 0 when the judge zeroes scratch) and its top bit flips exactly when
// the last block arrives, whichever block that is. A block waits until the top bit differs from the one in the
// value its own atomicAdd returned. Nothing depends on the epoch or on the grid size of earlier calls, so the word
// is reusable across calls without resets (and across grids of different sizes).
// Ordering: __syncthreads() gathers the block's writes, thread 0's __threadfence() makes them visible at device
// scope before its arrival, the spin uses ld.acquire.gpu, and data written by other blocks during the kernel is
// read with ld.global.cg (L2), never through the non-coherent or L1 path.
//
// Co-residency: the blocks spin on each other, so every block of every rank must be resident at once. In device
// mode `cuda-shared` all ranks' kernels share one GPU, so the grid is at most (SMs x resident blocks per SM, from
// the occupancy query) / world, which also holds with one GPU per rank.
//
// Speed: latency-bound. A round costs one pass over n values (from L2: the bands stay cached across rounds) and
// one grid barrier (about 1 us with ~100 blocks on an H200); the grid shrinks with n (about two 16-byte vectors per
// thread), down to one block, whose barrier is a __syncthreads(). Target: about 1.5-3 us per round at the
// benchmark sizes, against about 2 launches (4-6 us) per round for a kernel-per-phase version.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBlocks = 1024;
constexpr int64_t kPartOffset = 256;                               // bytes: part[2][kMaxBlocks] (8 bytes each)
constexpr int64_t kDataOffset = kPartOffset + 2 * kMaxBlocks * 8;  // bytes: W0, then W1
constexpr unsigned kFull = 0xffffffffu;

template <typename T> struct Vec;
template <> struct Vec<float> { using type = float4; static constexpr int n = 4; };
template <> struct Vec<double> { using type = double2; static constexpr int n = 2; };

template <typename T>
struct Params {
  const T* x;
  const T* lo;
  const T* di;
  const T* up;
  T* y;
  T* w[2];
  T* part;        // part[slot * kMaxBlocks + block]
  unsigned* bar;  // the barrier word
  int64_t n;
  int rounds;
};

__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// All blocks of the grid: nobody leaves before every block has arrived; writes before it are visible after it.
__device__ __forceinline__ void grid_sync(unsigned* bar) {
  __syncthreads();
  if (gridDim.x > 1 && threadIdx.x == 0) {
    const unsigned inc = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
    __threadfence();
    const unsigned old = atomicAdd(bar, inc);
    while (((ld_acquire_gpu(bar) ^ old) & 0x80000000u) == 0) {
    }
    __threadfence();
  }
  __syncthreads();
}

// V elements starting at element v * V; zeros beyond n. `coherent`: the data was written during this kernel
// (read from L2); otherwise it is a read-only input (read-only path).
template <typename T, bool kCoherent>
__device__ __forceinline__ void load_vec(const T* p, int64_t v, int64_t n, T (&out)[Vec<T>::n]) {
  constexpr int V = Vec<T>::n;
  using VT = typename Vec<T>::type;
  const int64_t i0 = v * V;
  if (i0 + V <= n) {
    const VT* q = reinterpret_cast<const VT*>(p) + v;
    const VT t = kCoherent ? __ldcg(q) : __ldg(q);
    const T* e = reinterpret_cast<const T*>(&t);
#pragma unroll
    for (int j = 0; j < V; ++j) out[j] = e[j];
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      out[j] = T(0);
      if (i0 + j < n) out[j] = kCoherent ? __ldcg(p + i0 + j) : __ldg(p + i0 + j);
    }
  }
}

template <typename T>
__device__ __forceinline__ void store_vec(T* p, int64_t v, int64_t n, const T (&val)[Vec<T>::n]) {
  constexpr int V = Vec<T>::n;
  using VT = typename Vec<T>::type;
  const int64_t i0 = v * V;
  if (i0 + V <= n) {
    VT t;
    T* e = reinterpret_cast<T*>(&t);
#pragma unroll
    for (int j = 0; j < V; ++j) e[j] = val[j];
    *(reinterpret_cast<VT*>(p) + v) = t;
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j)
      if (i0 + j < n) p[i0 + j] = val[j];
  }
}

template <typename T>
__device__ __forceinline__ T warp_max(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// One round: w = A y_k with y_k = src * scale; returns this thread's largest |w|.
template <typename T, bool kFirst>
__device__ __forceinline__ T sweep(const Params<T>& P, const T* src, T* dst, T scale) {
  constexpr int V = Vec<T>::n;
  const int lane = threadIdx.x & 31;
  const int64_t nv = (P.n + V - 1) / V;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  T local = T(0);
  // warp-uniform loop: the 32 lanes hold consecutive vectors, so the shuffles below see the neighbours
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads + (threadIdx.x & ~31); base < nv; base += stride) {
    const int64_t v = base + lane;
    const int64_t i0 = v * V;
    T y[V], a[V], b[V], c[V], w[V];
    load_vec<T, !kFirst>(src, v, P.n, y);
    if (!kFirst) {
#pragma unroll
      for (int j = 0; j < V; ++j) y[j] *= scale;
    }
    T left = __shfl_up_sync(kFull, y[V - 1], 1);
    T right = __shfl_down_sync(kFull, y[0], 1);
    if (lane == 0) {  // base < nv, so i0 < n here
      left = T(0);
      if (i0 > 0) left = (kFirst ? __ldg(src + i0 - 1) : __ldcg(src + i0 - 1) * scale);
    }
    if (lane == 31) {
      right = T(0);
      if (i0 + V < P.n) right = (kFirst ? __ldg(src + i0 + V) : __ldcg(src + i0 + V) * scale);
    }
    load_vec<T, false>(P.lo, v, P.n, a);
    load_vec<T, false>(P.di, v, P.n, b);
    load_vec<T, false>(P.up, v, P.n, c);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const T ym = j > 0 ? y[j - 1] : left;       // 0 before element 0
      const T yp = j < V - 1 ? y[j + 1] : right;  // 0 after element n-1 (zeros beyond n)
      T s = b[j] * y[j];
      s = fma(a[j], ym, s);
      s = fma(c[j], yp, s);
      w[j] = s;  // 0 beyond n (a, b, c are 0 there)
      local = fmax(local, fabs(s));
    }
    store_vec<T>(dst, v, P.n, w);
  }
  return local;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) power_kernel(const __grid_constant__ Params<T> P) {
  constexpr int V = Vec<T>::n;
  __shared__ T s_warp[kWarps];
  __shared__ T s_all[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const T* src = P.x;
  T scale = T(1);
  for (int k = 0; k < P.rounds; ++k) {
    const int slot = k & 1;
    T* dst = P.w[slot];
    T local = k == 0 ? sweep<T, true>(P, src, dst, scale) : sweep<T, false>(P, src, dst, scale);
    local = warp_max(local);
    if (lane == 0) s_warp[warp] = local;
    __syncthreads();
    if (threadIdx.x == 0) {
      T m = s_warp[0];
#pragma unroll
      for (int i = 1; i < kWarps; ++i) m = fmax(m, s_warp[i]);
      __stcg(P.part + slot * kMaxBlocks + blockIdx.x, m);
    }
    grid_sync(P.bar);
    // m_k: the largest of every block's maximum
    T m = T(0);
    for (int b = threadIdx.x; b < static_cast<int>(gridDim.x); b += kThreads)
      m = fmax(m, __ldcg(P.part + slot * kMaxBlocks + b));
    m = warp_max(m);
    if (lane == 0) s_all[warp] = m;
    __syncthreads();
    m = s_all[0];
#pragma unroll
    for (int i = 1; i < kWarps; ++i) m = fmax(m, s_all[i]);
    scale = T(1) / m;
    src = dst;
    // s_all is written again only after the next round's grid_sync (two __syncthreads later), s_warp after the
    // __syncthreads of that barrier's end: both have been read by then.
  }
  const int64_t nv = (P.n + V - 1) / V;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; v < nv; v += stride) {
    T y[V];
    load_vec<T, true>(src, v, P.n, y);
#pragma unroll
    for (int j = 0; j < V; ++j) y[j] *= scale;
    store_vec<T>(P.y, v, P.n, y);
  }
}

template <typename T>
int launch(const cb_args* args, cudaStream_t stream) {
  constexpr int V = Vec<T>::n;
  const int64_t n = args->count;
  const int64_t bytes = (n * static_cast<int64_t>(sizeof(T)) + 255) / 256 * 256;
  if (args->scratch_bytes < kDataOffset + 2 * bytes) return 10;
  int sms = 0, per_sm = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 11;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, power_kernel<T>, kThreads, 0) != cudaSuccess) return 12;
  int64_t cap = static_cast<int64_t>(sms) * per_sm / args->world;  // every rank's grid resident at once
  if (cap > kMaxBlocks) cap = kMaxBlocks;
  if (cap < 1) cap = 1;
  const int64_t nv = (n + V - 1) / V;
  int64_t grid = (nv + 2 * kThreads - 1) / (2 * kThreads);  // about two vectors per thread
  if (grid > cap) grid = cap;
  if (grid < 1) grid = 1;
  Params<T> P{};
  P.x = static_cast<const T*>(args->in);
  P.lo = static_cast<const T*>(args->aux_in[0]);
  P.di = static_cast<const T*>(args->aux_in[1]);
  P.up = static_cast<const T*>(args->aux_in[2]);
  P.y = static_cast<T*>(args->out);
  unsigned char* s = static_cast<unsigned char*>(args->scratch);
  P.bar = reinterpret_cast<unsigned*>(s);
  P.part = reinterpret_cast<T*>(s + kPartOffset);
  P.w[0] = reinterpret_cast<T*>(s + kDataOffset);
  P.w[1] = reinterpret_cast<T*>(s + kDataOffset + bytes);
  P.n = n;
  P.rounds = static_cast<int>(args->params[0]);
  power_kernel<T><<<static_cast<int>(grid), kThreads, 0, stream>>>(P);
  return cudaGetLastError() == cudaSuccess ? 0 : 13;
}

}  // namespace

CB_ENTRY power_iteration(const cb_args* args, cudaStream_t stream) {
  if (args->world < 1 || args->count < 1) return 1;
  if (args->params[0] < 1 || args->params[0] > 65535) return 2;
  switch (args->dtype) {
    case CB_FLOAT32: return launch<float>(args, stream);
    case CB_FLOAT64: return launch<double>(args, stream);
    default: return 3;
  }
}
