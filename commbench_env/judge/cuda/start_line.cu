// CommBench-Env harness kernel (never candidate code): the start line of a timed `cuda` call.
//
// Why: every rank's stream is held behind the judge's host gate (a stream memory wait on a word of host memory),
// and the GPUs do not see the gate open at the same moment: on 2 x H200 one rank's stream started 30-200 us after
// the other's, and a rank whose kernel waits for its peer (any collective) then timed the skew as its own work
// (two-shot all-reduce: 490 instead of 217 us at 64 MiB in some evaluations). So, right after the gate, each
// rank's stream runs this one-block barrier over peer memory; the judge records the start event behind it, and
// every rank's clock starts within a flag round trip (about 1-2 us over NVLink) of the others'.
//
// Rank r stores `epoch` into word r of every rank's line (its own included), then waits until every word of its
// own line has reached `epoch`. Words are never reset (the epoch grows by one per call). A rank that never
// arrives cannot hang the judge: after `timeout_ns` the kernel gives up, and the call's own time limit applies.
#include <stdint.h>

#include "commbench.h"

struct cb_start_line_args {
  uint32_t* lines[CB_MAX_RANKS];  // every rank's line: CB_MAX_RANKS words in that rank's device memory
  int32_t world;
  int32_t rank;
  uint32_t epoch;
  uint32_t reserved;
  uint64_t timeout_ns;
};

namespace {

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__global__ void start_line_kernel(const cb_start_line_args a) {
  const int t = threadIdx.x;
  if (t < a.world) {
    st_release_sys(a.lines[t] + a.rank, a.epoch);
    const uint32_t* mine = a.lines[a.rank] + t;
    const uint64_t t0 = global_ns();
    while (static_cast<int32_t>(ld_acquire_sys(mine) - a.epoch) < 0 && global_ns() - t0 < a.timeout_ns) {
    }
  }
  __syncthreads();
}

}  // namespace

extern "C" int cb_start_line(const cb_start_line_args* args, cudaStream_t stream) {
  start_line_kernel<<<1, 32, 0, stream>>>(*args);
  return static_cast<int>(cudaGetLastError());
}
