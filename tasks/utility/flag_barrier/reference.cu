// Reference: `rounds` rounds of publish / barrier / read inside one kernel, with a reusable flag barrier.
//
// One warp per rank; thread q (q < world, q != rank) is this rank's link to rank q. Round k:
//   1. thread 0 writes in[k] into slot k % 2 of this rank's own scratch;
//   2. __syncthreads() orders that write before the signals; thread q then issues __threadfence_system() and a
//      release store (st.release.sys) of seq = (epoch << 16) + k + 1 into peer_flags[q][rank]: "rank has entered
//      round k". It then polls its own flags[q] with acquire loads (ld.acquire.sys) until flags[q] >= seq;
//   3. thread q reads slot k % 2 of rank q's scratch (after its own acquire) into out[q * rounds + k]; thread
//      `rank` copies in[k] into out[rank * rounds + k];
//   4. __syncthreads(): nobody starts round k+1 (and thread 0 does not overwrite a slot) before every thread
//      has seen every peer enter round k.
// Why two slots: a peer q that leaves barrier k early publishes round k+1 in the OTHER slot; it writes slot
// k % 2 again only in round k+2, after barrier k+1, which it cannot pass before this rank has entered round
// k+1, i.e. after this rank read slot k % 2 (thread q reads it and later signals q, in program order, with
// release semantics). Why ">=": that same fast peer may already have signalled round k+1 when this rank polls
// for round k; the signed difference keeps the comparison right across the 32-bit wrap.
// Flags are never reset: the previous call left (epoch - 1) << 16 | rounds at most, below every seq of this
// call (rounds <= 65535), and the judge synchronises every device between calls.
//
// Each rank runs a single block, so all ranks' spinning blocks are always resident together, in either device
// mode and whatever order the kernels start in.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 32;
constexpr int64_t kMaxRounds = 65535;
constexpr int kSlotBytes = 16;  // slot s of a scratch starts at byte s * kSlotBytes

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

struct BarrierArgs {
  const void* in;
  void* out;
  unsigned char* scratch[CB_MAX_RANKS];  // every rank's scratch: two slots
  uint32_t* flags[CB_MAX_RANKS];         // every rank's flag words: flags[p][q] = "rank q entered round ..."
  int64_t rounds;
  int rank;
  int world;
  uint32_t epoch;
};

template <typename T>
__device__ __forceinline__ T slot_load(const unsigned char* scratch, int s) {
  return *reinterpret_cast<const volatile T*>(scratch + s * kSlotBytes);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) barrier_kernel(const __grid_constant__ BarrierArgs a) {
  const int t = threadIdx.x;
  const T* x = static_cast<const T*>(a.in);
  T* y = static_cast<T*>(a.out);
  const bool link = t < a.world && t != a.rank;
  const uint32_t base = a.epoch << 16;
  for (int64_t k = 0; k < a.rounds; ++k) {
    const int s = static_cast<int>(k & 1);
    const uint32_t seq = base + static_cast<uint32_t>(k) + 1u;
    const T mine = x[k];
    if (t == 0) *reinterpret_cast<volatile T*>(a.scratch[a.rank] + s * kSlotBytes) = mine;
    __syncthreads();
    if (link) {
      __threadfence_system();
      st_release_sys(a.flags[t] + a.rank, seq);
      const uint32_t* f = a.flags[a.rank] + t;
      while (static_cast<int32_t>(ld_acquire_sys(f) - seq) < 0) {
      }
      y[t * a.rounds + k] = slot_load<T>(a.scratch[t], s);
    } else if (t == a.rank) {
      y[t * a.rounds + k] = mine;
    }
    __syncthreads();
  }
}

}  // namespace

CB_ENTRY barrier_rounds(const cb_args* args, cudaStream_t stream) {
  if (args->world < 1 || args->world > CB_MAX_RANKS || args->world > kThreads) return 1;
  if (args->count <= 0) return 0;  // every rank has the same count: nobody waits
  if (args->count > kMaxRounds) return 2;
  if (args->flag_words < args->world || args->scratch_bytes < 2 * kSlotBytes) return 3;
  BarrierArgs k{};
  k.in = args->in;
  k.out = args->out;
  for (int p = 0; p < args->world; ++p) {
    k.scratch[p] = static_cast<unsigned char*>(args->peer_scratch[p]);
    k.flags[p] = args->peer_flags[p];
  }
  k.rounds = args->count;
  k.rank = args->rank;
  k.world = args->world;
  k.epoch = args->epoch;
  switch (args->dtype) {
    case CB_FLOAT32: case CB_INT32:
      barrier_kernel<uint32_t><<<1, kThreads, 0, stream>>>(k);
      break;
    case CB_FLOAT16: case CB_BFLOAT16:
      barrier_kernel<uint16_t><<<1, kThreads, 0, stream>>>(k);
      break;
    case CB_FLOAT64: case CB_INT64:
      barrier_kernel<unsigned long long><<<1, kThreads, 0, stream>>>(k);
      break;
    case CB_UINT8:
      barrier_kernel<uint8_t><<<1, kThreads, 0, stream>>>(k);
      break;
    default:
      return 4;
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 5;
}
