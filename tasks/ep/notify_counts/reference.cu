// Reference: the count handshake before an expert-parallel dispatch (DeepEP's notify_dispatch), in ONE block of
// ONE kernel per rank, with the low-latency protocol: every count travels with its call's epoch in one 8-byte word.
//
// Rank s sends every rank p (itself included) a row of epr + 1 words: the counts of p's epr experts, then its
// token count for p. Word c of that row lands at word s * (epr + 1) + c of p's scratch, as
//   (epoch << 32) | count,
// stored with one st.relaxed.sys.global.u64. An aligned 8-byte store is single-copy atomic (the LL protocol of
// NCCL relies on the same over NVLink), so a receiver that polls the word with ld.relaxed.sys.global.u64 and sees
// this call's epoch in the high half holds the count stored with it: no fence, no separate flag, no second round
// trip. Each word has one writer; a word left from an earlier call carries an older epoch (scratch is zeroed once
// and epoch >= 1), so nothing is ever reset. The judge synchronises every device between calls, so no word is
// overwritten by the next call before it was read.
//
// Then each rank turns the world x (epr + 1) counts it received into the outputs: thread l < epr walks the sources
// in order for expert_offsets column l, thread epr for rank_offsets (at most 8 sources: a serial walk is shorter
// than any scan).
//
// Deadlock freedom: every thread's sends are issued before any thread of the block polls (__syncthreads between),
// and each rank's one block is resident while it waits: with all ranks on one GPU that is world <= 8 blocks of
// 1024 threads, one per SM.
//
// Latency target (metric latency, E = 16 and 256): the critical path is one kernel launch, one remote 8-byte store
// and one poll, flat in E (at most 1032 words per rank, one or two per thread). On one H200 in cuda-shared the call
// costs about what the judge measures for the other one-round LL kernels there (collective/allreduce_ll_small:
// about 8 us at world 2 and 16 us at world 4 at 256 B, dominated by getting world kernels onto one GPU); with one
// GPU per rank, a few microseconds (one launch plus one NVLink round trip of about 1-2 us).
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 1024;
constexpr int kMaxEpr = 128;
constexpr int kMaxWords = CB_MAX_RANKS * (kMaxEpr + 1);

struct NotifyArgs {
  const int32_t* per_expert;        // [E] this rank's entries per expert
  const int32_t* per_rank;          // [world] this rank's tokens per destination rank
  uint64_t* slots[CB_MAX_RANKS];    // every rank's receive words (its scratch): [world][epr + 1]
  int32_t* expert_offsets;          // [world + 1][epr]
  int32_t* rank_offsets;            // [world + 1]
  int world, rank, epr;
  uint32_t epoch;
};

__device__ __forceinline__ void st_word(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t ld_word(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__global__ void __launch_bounds__(kThreads, 1) notify_kernel(const __grid_constant__ NotifyArgs a) {
  __shared__ int32_t cnt[kMaxWords];  // [source][epr + 1] as received
  const int row = a.epr + 1;
  const int words = a.world * row;
  const uint64_t tag = static_cast<uint64_t>(a.epoch) << 32;

  // 1. send: word c of this rank's row in rank p's slots (coalesced over p's row)
  for (int q = threadIdx.x; q < words; q += kThreads) {
    const int p = q / row, c = q - p * row;
    const int32_t v = c < a.epr ? a.per_expert[p * a.epr + c] : a.per_rank[p];
    st_word(a.slots[p] + static_cast<int64_t>(a.rank) * row + c, tag | static_cast<uint32_t>(v));
  }
  __syncthreads();  // every send of this block is issued before any of its threads waits

  // 2. receive: poll the own slots until each word carries this call's epoch
  const uint64_t* mine = a.slots[a.rank];
  for (int q = threadIdx.x; q < words; q += kThreads) {
    uint64_t w = ld_word(mine + q);
    while (static_cast<uint32_t>(w >> 32) != a.epoch) w = ld_word(mine + q);
    cnt[q] = static_cast<int32_t>(static_cast<uint32_t>(w));
  }
  __syncthreads();

  // 3. exclusive prefixes over the sources: column l < epr of expert_offsets, column epr gives rank_offsets
  for (int l = threadIdx.x; l <= a.epr; l += kThreads) {
    int32_t run = 0;
    for (int s = 0; s < a.world; ++s) {
      if (l < a.epr) a.expert_offsets[s * a.epr + l] = run;
      else a.rank_offsets[s] = run;
      run += cnt[s * row + l];
    }
    if (l < a.epr) a.expert_offsets[a.world * a.epr + l] = run;
    else a.rank_offsets[a.world] = run;
  }
}

}  // namespace

CB_ENTRY notify_counts(const cb_args* args, cudaStream_t stream) {
  const int world = args->world;
  const int64_t epr = args->params[0];
  if (world < 1 || world > CB_MAX_RANKS || epr < 1 || epr > kMaxEpr) return 1;
  if (args->dtype != CB_INT32 || args->count != world * epr || args->aux_in_count[0] != world ||
      args->out_count != (world + 1) * epr || args->aux_out_count[0] != world + 1)
    return 4;
  if (args->scratch_bytes < static_cast<int64_t>(sizeof(uint64_t)) * world * (epr + 1)) return 5;

  NotifyArgs a{};
  a.per_expert = static_cast<const int32_t*>(args->in);
  a.per_rank = static_cast<const int32_t*>(args->aux_in[0]);
  for (int p = 0; p < world; ++p) a.slots[p] = static_cast<uint64_t*>(args->peer_scratch[p]);
  a.expert_offsets = static_cast<int32_t*>(args->out);
  a.rank_offsets = static_cast<int32_t*>(args->aux_out[0]);
  a.world = world;
  a.rank = args->rank;
  a.epr = static_cast<int>(epr);
  a.epoch = args->epoch;
  notify_kernel<<<1, kThreads, 0, stream>>>(a);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
