// Reference: all-reduce + residual add + RMSNorm, fused into one kernel over peer pointers.
//
// x is [T, d] on every rank; residual [T, d] and weight [d] are the same on every rank. One block normalises
// one row at a time: it sums row t of every rank's x (read straight from the peers' memory, float32, rank order),
// adds the residual, keeps h in shared memory (or, for a very wide row, in this block's part of the scratch
// buffer), reduces sum(h^2) over the block, and writes y = h * rsqrt(mean(h^2) + eps) * weight.
//
// Two schedules, chosen from the sizes alone so that every rank picks the same one:
// - one-shot (small tensors): every rank normalises every row itself. No flags, one pass over the links, but
//   each rank reads (world - 1) x the tensor.
// - two-shot (large tensors): rows are cut into `world` slices; rank r normalises slice r only, into its OWN
//   output, then block b of rank r tells block b of every peer that its rows are done (epoch into
//   peer_flags[p][b * world + r]; the peers' blocks poll their own flag words), and finally copies the other
//   slices' finished rows out of their owners' outputs. Row i of a slice belongs to block i % grid in both
//   steps, so block b only waits for block b of each peer. Each rank moves 2 (world-1)/world x the tensor, and
//   the normalisation itself is split over the ranks instead of repeated on each.
//
// Memory ordering of the barrier: __syncthreads() orders the block's output writes before the signalling
// threads, which issue __threadfence_system() and then st.release.sys of the flag into the peer's memory; the
// waiting threads poll their own flags with ld.acquire.sys and __syncthreads() releases the block to read the
// peers' outputs. Flags are never reset ("flag >= epoch" means "set during this call"). The judge synchronises
// every device before and after each round of calls, so an owner's output is not refilled while it is read.
// In the two-shot schedule every block spins, so all blocks of all ranks sharing a GPU must be resident at
// once: three quarters of the blocks the occupancy calculator says fit (small blocks, six per SM, so that many
// rows are in flight on every SM; the loads of four ranks at a time keep registers under 85, unspilled), divided
// by the ranks on the GPU. Measured on one H200 (cuda-shared, bf16, 64 MiB): 49 / 78 / 93 % of the copy
// roofline at worlds 2 / 4 / 8, where one 512-thread block per SM on half the SMs reached 21 / 39 / 53 %.
// At world 2 the schedule moves 3 bytes of memory per byte of x (read x from both ranks, the residual, write,
// then copy the peer's half), so busbw can reach at most 4 (W - 1) / (3 W) = 2/3 of the copy roofline there.
#include "commbench.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>

namespace {

constexpr int kThreads = 128;
constexpr int kMinBlocks = 6;                   // six 128-thread blocks per SM (85 registers): rows in flight, not threads
constexpr int64_t kSmemRowBytes = 48 * 1024;    // h of a row in shared memory up to d = 12288 (no opt-in needed)
constexpr int64_t kOneShotBytes = 1 << 20;      // one-shot while (world - 1) * tensor bytes stays under this

template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T, int N> struct alignas(sizeof(T) * N) Pack { T v[N]; };

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

struct FusedArgs {
  const void* x[CB_MAX_RANKS];    // every rank's x
  const void* y[CB_MAX_RANKS];    // every rank's output
  uint32_t* flags[CB_MAX_RANKS];  // every rank's flag words
  const void* residual;           // this rank's copy
  const void* weight;             // this rank's copy
  float* stage;                   // this rank's scratch: d floats per block, when h does not fit shared memory
  int64_t rows;
  int64_t d;
  int64_t rows_per_slice;
  float eps;
  int rank;
  int world;
  uint32_t epoch;
};

__device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? red[lane] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) red[32] = v;
  }
  __syncthreads();
  const float total = red[32];
  __syncthreads();  // red[] is reused by the next row
  return total;
}

// Normalise row `row` into this rank's output. h is laid out [N][d / N] (element i of pack k at i * np + k) so
// that consecutive threads touch consecutive words of shared memory.
template <typename T, int N, bool kSmem>
__device__ __forceinline__ void norm_row(const FusedArgs& a, int64_t row, float* smem_h, float* red) {
  using P = Pack<T, N>;
  const int64_t base = row * a.d;
  const int64_t np = a.d / N;  // N divides d
  float* h = kSmem ? smem_h : a.stage + static_cast<int64_t>(blockIdx.x) * a.d;
  const T* res = static_cast<const T*>(a.residual);
  const T* w = static_cast<const T*>(a.weight);
  T* out = static_cast<T*>(const_cast<void*>(a.y[a.rank]));
  float ss = 0.f;
  for (int64_t k = threadIdx.x; k < np; k += kThreads) {
    const int64_t e = base + k * N;
    const P r = *reinterpret_cast<const P*>(res + e);
    float acc[N];
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = 0.f;  // 0 + x_0 == x_0: the sum is still in rank order
#pragma unroll
    for (int p0 = 0; p0 < CB_MAX_RANKS; p0 += 4) {  // four ranks' loads in flight at a time: no spills
      if (p0 >= a.world) break;
      P v[4];
#pragma unroll
      for (int q = 0; q < 4; ++q)
        if (p0 + q < a.world) v[q] = *reinterpret_cast<const P*>(static_cast<const T*>(a.x[p0 + q]) + e);
#pragma unroll
      for (int q = 0; q < 4; ++q)
        if (p0 + q < a.world) {
#pragma unroll
          for (int i = 0; i < N; ++i) acc[i] += to_float(v[q].v[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
      acc[i] += to_float(r.v[i]);
      ss += acc[i] * acc[i];
      h[i * np + k] = acc[i];
    }
  }
  const float scale = rsqrtf(block_sum(ss, red) / static_cast<float>(a.d) + a.eps);
  for (int64_t k = threadIdx.x; k < np; k += kThreads) {  // same k as above: each thread rereads its own h
    const P wv = *reinterpret_cast<const P*>(w + k * N);
    P o;
#pragma unroll
    for (int i = 0; i < N; ++i) o.v[i] = from_float<T>(h[i * np + k] * scale * to_float(wv.v[i]));
    *reinterpret_cast<P*>(out + base + k * N) = o;
  }
}

template <typename T, int N, bool kSmem, bool kTwoShot>
__global__ void __launch_bounds__(kThreads, kMinBlocks) fused_kernel(const __grid_constant__ FusedArgs a) {
  extern __shared__ float smem_h[];
  __shared__ float red[33];
  const int64_t lo = kTwoShot ? min(a.rank * a.rows_per_slice, a.rows) : 0;
  const int64_t hi = kTwoShot ? min(lo + a.rows_per_slice, a.rows) : a.rows;
  for (int64_t row = lo + blockIdx.x; row < hi; row += gridDim.x) norm_row<T, N, kSmem>(a, row, smem_h, red);
  if constexpr (kTwoShot) {
    using P = Pack<T, N>;
    __syncthreads();
    const int t = threadIdx.x;
    const int64_t slot = static_cast<int64_t>(blockIdx.x) * a.world;
    if (t < a.world && t != a.rank) {
      __threadfence_system();
      st_release_sys(a.flags[t] + slot + a.rank, a.epoch);
    }
    if (t < a.world && t != a.rank) {
      const uint32_t* f = a.flags[a.rank] + slot + t;
      while (static_cast<int32_t>(ld_acquire_sys(f) - a.epoch) < 0) {
      }
    }
    __syncthreads();
    T* out = static_cast<T*>(const_cast<void*>(a.y[a.rank]));
    const int64_t np = a.d / N;
    for (int j = 1; j < a.world; ++j) {
      const int p = (a.rank + j) % a.world;
      const T* src = static_cast<const T*>(a.y[p]);
      const int64_t plo = min(p * a.rows_per_slice, a.rows);
      const int64_t phi = min(plo + a.rows_per_slice, a.rows);
      for (int64_t row = plo + blockIdx.x; row < phi; row += gridDim.x)
        for (int64_t k = threadIdx.x; k < np; k += kThreads) {
          const int64_t e = row * a.d + k * N;
          *reinterpret_cast<P*>(out + e) = *reinterpret_cast<const P*>(src + e);
        }
    }
  }
}

int ranks_per_gpu(const cb_args* a) {
  if (a->world < 2) return 1;
  cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, a->peer_flags[(a->rank + 1) % a->world]) != cudaSuccess) {
    (void)cudaGetLastError();
    return a->world;
  }
  return at.device == a->device ? a->world : 1;
}

template <typename T, int N, bool kSmem, bool kTwoShot>
int launch_one(int64_t want, int rpg, int sms, size_t smem, const FusedArgs& k, int64_t flag_cap, cudaStream_t stream) {
  auto kernel = fused_kernel<T, N, kSmem, kTwoShot>;
  (void)cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  int occ = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, kThreads, smem) != cudaSuccess || occ < 1) occ = 1;
  int64_t grid = want;
  if (kTwoShot) {
    // every block spins at the end, so all blocks of all ranks on a GPU must be resident together: three
    // quarters of what the occupancy calculator allows, shared by the ranks on this GPU
    grid = std::min<int64_t>(grid, std::max<int64_t>(1, static_cast<int64_t>(occ) * sms * 3 / 4 / rpg));
    grid = std::min<int64_t>(grid, flag_cap);
  } else {
    grid = std::min<int64_t>(grid, static_cast<int64_t>(occ) * sms);
  }
  if (grid < 1) return 5;
  kernel<<<static_cast<unsigned>(grid), kThreads, smem, stream>>>(k);
  return 0;
}

template <typename T, int N, bool kSmem>
int launch_kernel(bool two_shot, int64_t want, int rpg, int sms, size_t smem, const FusedArgs& k, int64_t flag_cap,
                  cudaStream_t stream) {
  return two_shot ? launch_one<T, N, kSmem, true>(want, rpg, sms, smem, k, flag_cap, stream)
                  : launch_one<T, N, kSmem, false>(want, rpg, sms, smem, k, flag_cap, stream);
}

template <typename T>
int launch(const cb_args* a, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t d = a->aux_in_count[1];
  if (d < 1 || a->count % d != 0 || a->aux_in_count[0] != a->count || a->out_count != a->count) return 4;
  FusedArgs k{};
  k.rows = a->count / d;
  k.d = d;
  k.rank = a->rank;
  k.world = a->world;
  k.epoch = a->epoch;
  k.eps = static_cast<float>(static_cast<double>(a->params[0]) * 1e-9);
  k.residual = a->aux_in[0];
  k.weight = a->aux_in[1];
  k.stage = static_cast<float*>(a->scratch);
  bool aligned = d % kVec == 0 &&
                 ((reinterpret_cast<uintptr_t>(a->aux_in[0]) | reinterpret_cast<uintptr_t>(a->aux_in[1])) & 15) == 0;
  for (int p = 0; p < a->world; ++p) {
    k.x[p] = a->peer_in[p];
    k.y[p] = a->peer_out[p];
    k.flags[p] = a->peer_flags[p];
    aligned = aligned && ((reinterpret_cast<uintptr_t>(a->peer_in[p]) | reinterpret_cast<uintptr_t>(a->peer_out[p])) & 15) == 0;
  }
  // Everything below depends only on sizes shared by all ranks: the same schedule and grid everywhere.
  const int64_t bytes = a->count * static_cast<int64_t>(sizeof(T));
  const bool two_shot = a->world > 1 && bytes * (a->world - 1) > kOneShotBytes;
  k.rows_per_slice = two_shot ? (k.rows + a->world - 1) / a->world : k.rows;
  const bool smem_h = d * static_cast<int64_t>(sizeof(float)) <= kSmemRowBytes;
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, a->device) != cudaSuccess) return 2;
  int64_t want = k.rows_per_slice;
  if (!smem_h) want = std::min<int64_t>(want, a->scratch_bytes / (d * static_cast<int64_t>(sizeof(float))));
  if (want < 1) return 5;  // too little scratch for a single block
  const int rpg = two_shot ? ranks_per_gpu(a) : 1;
  const int64_t flag_cap = a->flag_words / a->world;
  const size_t smem = smem_h ? static_cast<size_t>(d) * sizeof(float) : 0;
  int rc;
  if (aligned) {
    rc = smem_h ? launch_kernel<T, kVec, true>(two_shot, want, rpg, sms, smem, k, flag_cap, stream)
                : launch_kernel<T, kVec, false>(two_shot, want, rpg, sms, smem, k, flag_cap, stream);
  } else {
    rc = smem_h ? launch_kernel<T, 1, true>(two_shot, want, rpg, sms, smem, k, flag_cap, stream)
                : launch_kernel<T, 1, false>(two_shot, want, rpg, sms, smem, k, flag_cap, stream);
  }
  if (rc) return rc;
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}

}  // namespace

CB_ENTRY allreduce_residual_rmsnorm(const cb_args* args, cudaStream_t stream) {
  if (args->count <= 0) return 0;
  if (args->world < 1 || args->world > CB_MAX_RANKS) return 1;
  switch (args->dtype) {
    case CB_FLOAT32: return launch<float>(args, stream);
    case CB_FLOAT16: return launch<__half>(args, stream);
    case CB_BFLOAT16: return launch<__nv_bfloat16>(args, stream);
    default: return 1;
  }
}
