// Reference: a histogram sharded over the ranks, filled with system-scope atomics on the owners' memory.
//
// One kernel per rank, every block resident at once:
//   1. block 0 zeroes this rank's bins (its `out`), __syncthreads(), and thread q (q < world) issues
//      __threadfence_system() and st.release.sys of `epoch` into peer_flags[q][rank]: "rank's bins are zero for
//      this call, add away". (flags[q] on a rank therefore means "owner q is ready".)
//   2. every block counts its share of the ids in a block-local shared-memory histogram of all world * bins
//      bins (shared atomics are cheap, and hot bins are merged before they ever leave the SM) -- while the other
//      ranks are still zeroing;
//   3. thread q waits with ld.acquire.sys until flags[q] >= epoch, for every owner q, then __syncthreads();
//   4. the block adds each non-zero count to its owner's bin with one atomicAdd_system (executed by the owner's
//      memory over NVLink, or locally in cuda-shared mode), so additions from all ranks are never lost.
// When world * bins counters do not fit in shared memory, step 2 is skipped and step 4 adds 1 per id.
// Flags are never reset ("flag >= epoch" means "set during this call"; epoch grows by one per call), and no flag
// is needed at the end: the judge synchronises every device after all calls, before reading the outputs.
//
// Blocks spin in step 3 on other ranks' block 0 (and their own), so all blocks of all ranks sharing a GPU must be
// resident together: at most one block per SM (__launch_bounds__(512, 1), at most one opt-in shared-memory
// histogram per SM), and with all ranks on one GPU, half the SMs divided by the number of ranks.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 512;
constexpr int kIdsPerThread = 16;  // ids per thread before another block pays for its own histogram flush

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

struct HistArgs {
  const int32_t* ids;
  int64_t n;                     // this rank's ids
  int32_t* out[CB_MAX_RANKS];    // every rank's bins
  uint32_t* flags[CB_MAX_RANKS];  // every rank's flag words
  int64_t bins;                  // bins per rank
  int rank;
  int world;
  uint32_t epoch;
  bool in_smem;                  // world * bins counters fit in the dynamic shared memory
};

__global__ void __launch_bounds__(kThreads, 1) histogram_kernel(const __grid_constant__ HistArgs a) {
  extern __shared__ uint32_t hist[];
  const int t = threadIdx.x;
  const uint32_t total = static_cast<uint32_t>(a.bins * a.world);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + t;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;

  // 1. zero own bins, then tell every rank they are ready
  if (blockIdx.x == 0) {
    int32_t* mine = a.out[a.rank];
    for (int64_t j = t; j < a.bins; j += kThreads) mine[j] = 0;
    __syncthreads();
    if (t < a.world) {
      __threadfence_system();
      st_release_sys(a.flags[t] + a.rank, a.epoch);
    }
  }

  // 2. block-local histogram
  if (a.in_smem) {
    for (uint32_t g = t; g < total; g += kThreads) hist[g] = 0;
    __syncthreads();
    for (int64_t i = first; i < a.n; i += stride) {
      const uint32_t g = static_cast<uint32_t>(a.ids[i]);
      if (g < total) atomicAdd(&hist[g], 1u);
    }
  }

  // 3. wait until every owner has zeroed its bins
  if (t < a.world) {
    const uint32_t* f = a.flags[a.rank] + t;
    while (static_cast<int32_t>(ld_acquire_sys(f) - a.epoch) < 0) {
    }
  }
  __syncthreads();

  // 4. add into the owners' bins
  const uint32_t bins = static_cast<uint32_t>(a.bins);
  if (a.in_smem) {
    for (uint32_t g = t; g < total; g += kThreads) {
      const uint32_t c = hist[g];
      if (c != 0) atomicAdd_system(reinterpret_cast<unsigned int*>(a.out[g / bins] + g % bins), c);
    }
  } else {
    for (int64_t i = first; i < a.n; i += stride) {
      const uint32_t g = static_cast<uint32_t>(a.ids[i]);
      if (g < total) atomicAdd_system(reinterpret_cast<unsigned int*>(a.out[g / bins] + g % bins), 1u);
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

}  // namespace

CB_ENTRY histogram(const cb_args* args, cudaStream_t stream) {
  if (args->world < 1 || args->world > CB_MAX_RANKS) return 1;
  if (args->dtype != CB_INT32) return 1;
  const int64_t bins = args->params[0];
  if (bins < 1 || bins != args->out_count || bins * args->world > INT32_MAX) return 2;
  if (args->flag_words < args->world) return 3;
  HistArgs k{};
  k.ids = static_cast<const int32_t*>(args->in);
  k.n = args->count > 0 ? args->count : 0;
  for (int p = 0; p < args->world; ++p) {
    k.out[p] = static_cast<int32_t*>(args->peer_out[p]);
    k.flags[p] = args->peer_flags[p];
  }
  k.bins = bins;
  k.rank = args->rank;
  k.world = args->world;
  k.epoch = args->epoch;

  int sms = 0, smem_optin = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 4;
  if (cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, args->device) != cudaSuccess)
    return 4;
  const int64_t smem = bins * args->world * static_cast<int64_t>(sizeof(uint32_t));
  k.in_smem = smem <= smem_optin;
  const size_t dyn = k.in_smem ? static_cast<size_t>(smem) : 0;
  if (dyn > 48 * 1024 &&
      cudaFuncSetAttribute(histogram_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dyn)) !=
          cudaSuccess)
    return 5;

  const int64_t per_block = static_cast<int64_t>(kThreads) * kIdsPerThread;
  int64_t grid = (k.n + per_block - 1) / per_block;
  const int rpg = ranks_per_gpu(args);
  const int64_t resident = rpg > 1 ? sms / (2 * rpg) : sms;  // one block per SM is guaranteed resident
  if (grid > resident) grid = resident;
  if (grid < 1) grid = 1;  // block 0 must run even without ids: it zeroes the bins and raises the flags
  histogram_kernel<<<static_cast<unsigned>(grid), kThreads, dyn, stream>>>(k);
  return cudaGetLastError() == cudaSuccess ? 0 : 6;
}
