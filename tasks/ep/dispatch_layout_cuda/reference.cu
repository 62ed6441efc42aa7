// Reference: the dispatch layout of top-k routing (DeepEP's get_dispatch_layout plus the send slots), in three
// kernels over B blocks that each own a contiguous range of tokens:
//   1. count: one thread per token ORs the owners of its k experts into a rank mask (is_token_in_rank, written
//      as one 2/4/8-byte store per token, and kept as one byte per token in scratch), counts entries per expert
//      in a shared-memory histogram and tokens per rank with warp reductions, and writes the block's partial
//      counts to scratch. Partials, not global atomics: no zeroing pass, and the result does not depend on order.
//   2. scan (one block): warp r scans the blocks' counts for rank r (each block's first slot, and the totals:
//      tokens_per_rank); thread e sums the blocks' counts of expert e (tokens_per_expert).
//   3. slot: each block walks its tokens again (the mask bytes, not topk_idx) in rounds of 512; a ballot per
//      rank gives each token's position within its warp, a scan over the 16 warp totals the warp's base, and a
//      running carry per rank continues from the block's first slot.
// Nothing is exchanged with other ranks: the layout is what a rank computes before it notifies its peers.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 512;  // count and slot kernels: one token per thread per round
constexpr int kWarps = kThreads / 32;
constexpr int kScanThreads = 1024;
constexpr int kMaxExperts = 1024;
constexpr unsigned kFull = 0xffffffffu;

struct LayoutArgs {
  const int64_t* topk;          // [T, k]
  uint8_t* in_rank;             // [T, world] bool
  int32_t* tokens_per_rank;     // [world]
  int32_t* tokens_per_expert;   // [experts]
  int32_t* send_slot;           // [T, world]
  uint8_t* masks;               // scratch [T]: bit r set when the token goes to rank r
  int32_t* part_rank;           // scratch [blocks, world]: the block's tokens per rank, then its first slot
  int32_t* part_expert;         // scratch [blocks, experts]: the block's entries per expert
  int64_t tokens;
  int64_t per_block;            // tokens of each block (the last block may have fewer)
  int k, epr, world, experts, blocks;
};

// is_token_in_rank of one token: byte r = bit r of mask, with one store when world is 2, 4 or 8 and dst aligned.
__device__ __forceinline__ void store_row(uint8_t* dst, uint32_t mask, int world) {
  uint64_t v = 0;
#pragma unroll
  for (int r = 0; r < CB_MAX_RANKS; ++r) v |= static_cast<uint64_t>((mask >> r) & 1u) << (8 * r);
  const uintptr_t at = reinterpret_cast<uintptr_t>(dst);
  if (world == 8 && (at & 7) == 0) {
    *reinterpret_cast<uint64_t*>(dst) = v;
  } else if (world == 4 && (at & 3) == 0) {
    *reinterpret_cast<uint32_t*>(dst) = static_cast<uint32_t>(v);
  } else if (world == 2 && (at & 1) == 0) {
    *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(v);
  } else {
    for (int r = 0; r < world; ++r) dst[r] = static_cast<uint8_t>((mask >> r) & 1u);
  }
}

__global__ void __launch_bounds__(kThreads) count_kernel(const __grid_constant__ LayoutArgs a) {
  __shared__ int hist[kMaxExperts];
  __shared__ int rank_count[CB_MAX_RANKS];
  const int tid = threadIdx.x;
  for (int e = tid; e < a.experts; e += kThreads) hist[e] = 0;
  if (tid < CB_MAX_RANKS) rank_count[tid] = 0;
  __syncthreads();

  const int64_t lo = static_cast<int64_t>(blockIdx.x) * a.per_block;
  const int64_t hi = min(lo + a.per_block, a.tokens);
  int cnt[CB_MAX_RANKS] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = lo + tid; i < hi; i += kThreads) {
    const int64_t* row = a.topk + i * a.k;
    uint32_t mask = 0;
    for (int j = 0; j < a.k; ++j) {
      const int64_t e = row[j];
      if (e >= 0 && e < a.experts) {
        mask |= 1u << static_cast<int>(e / a.epr);
        atomicAdd(&hist[e], 1);
      }
    }
    a.masks[i] = static_cast<uint8_t>(mask);
    store_row(a.in_rank + i * a.world, mask, a.world);
#pragma unroll
    for (int r = 0; r < CB_MAX_RANKS; ++r) cnt[r] += static_cast<int>((mask >> r) & 1u);
  }
#pragma unroll
  for (int r = 0; r < CB_MAX_RANKS; ++r) {
    int v = cnt[r];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
    if ((tid & 31) == 0 && r < a.world && v != 0) atomicAdd(&rank_count[r], v);
  }
  __syncthreads();
  if (tid < a.world) a.part_rank[blockIdx.x * a.world + tid] = rank_count[tid];
  for (int e = tid; e < a.experts; e += kThreads) a.part_expert[static_cast<int64_t>(blockIdx.x) * a.experts + e] = hist[e];
}

__global__ void __launch_bounds__(kScanThreads) scan_kernel(const __grid_constant__ LayoutArgs a) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (warp < a.world) {  // warp r: exclusive scan over the blocks of their token counts for rank r
    const int r = warp;
    int run = 0;
    for (int b0 = 0; b0 < a.blocks; b0 += 32) {
      const int b = b0 + lane;
      const int v = b < a.blocks ? a.part_rank[b * a.world + r] : 0;
      int x = v;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(kFull, x, o);
        if (lane >= o) x += y;
      }
      if (b < a.blocks) a.part_rank[b * a.world + r] = run + x - v;
      run += __shfl_sync(kFull, x, 31);
    }
    if (lane == 0) a.tokens_per_rank[r] = run;
  }
  for (int e = tid; e < a.experts; e += kScanThreads) {
    int s = 0;
#pragma unroll 8
    for (int b = 0; b < a.blocks; ++b) s += a.part_expert[static_cast<int64_t>(b) * a.experts + e];
    a.tokens_per_expert[e] = s;
  }
}

__global__ void __launch_bounds__(kThreads) slot_kernel(const __grid_constant__ LayoutArgs a) {
  __shared__ int warp_base[kWarps][CB_MAX_RANKS];
  __shared__ int carry[CB_MAX_RANKS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned below = (1u << lane) - 1u;  // lanes before this one
  if (tid < CB_MAX_RANKS) carry[tid] = tid < a.world ? a.part_rank[blockIdx.x * a.world + tid] : 0;
  __syncthreads();

  const int64_t lo = static_cast<int64_t>(blockIdx.x) * a.per_block;
  const int64_t hi = min(lo + a.per_block, a.tokens);
  for (int64_t base = lo; base < hi; base += kThreads) {  // the same number of rounds for every thread
    const int64_t i = base + tid;
    const uint32_t mask = i < hi ? a.masks[i] : 0u;
    int pre[CB_MAX_RANKS];
#pragma unroll
    for (int r = 0; r < CB_MAX_RANKS; ++r) {
      const unsigned b = __ballot_sync(kFull, (mask >> r) & 1u);
      pre[r] = __popc(b & below);
      if (lane == 0) warp_base[warp][r] = __popc(b);
    }
    __syncthreads();
    if (tid < a.world) {  // warp totals -> warp bases, continuing from the previous round
      int run = carry[tid];
      for (int w = 0; w < kWarps; ++w) {
        const int t = warp_base[w][tid];
        warp_base[w][tid] = run;
        run += t;
      }
      carry[tid] = run;
    }
    __syncthreads();
    if (i < hi) {
      int32_t* row = a.send_slot + i * a.world;
#pragma unroll
      for (int r = 0; r < CB_MAX_RANKS; ++r)
        if (r < a.world) row[r] = ((mask >> r) & 1u) ? warp_base[warp][r] + pre[r] : -1;
    }
    __syncthreads();  // warp_base is rewritten by the next round
  }
}

int64_t align16(int64_t n) { return (n + 15) / 16 * 16; }

}  // namespace

CB_ENTRY dispatch_layout(const cb_args* args, cudaStream_t stream) {
  const int world = args->world;
  const int64_t epr = args->params[0], k = args->params[1];
  if (args->dtype != CB_INT64 || world < 1 || world > CB_MAX_RANKS || epr < 1 || k < 1) return 1;
  if (world * epr > kMaxExperts || args->count % k != 0) return 1;
  const int experts = static_cast<int>(world * epr);
  const int64_t tokens = args->count / k;
  if (args->out_count != tokens * world || args->aux_out_count[0] != world || args->aux_out_count[1] != experts ||
      args->aux_out_count[2] != tokens * world)
    return 4;

  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  LayoutArgs a{};
  a.topk = static_cast<const int64_t*>(args->in);
  a.in_rank = static_cast<uint8_t*>(args->out);
  a.tokens_per_rank = static_cast<int32_t*>(args->aux_out[0]);
  a.tokens_per_expert = static_cast<int32_t*>(args->aux_out[1]);
  a.send_slot = static_cast<int32_t*>(args->aux_out[2]);
  a.tokens = tokens;
  a.k = static_cast<int>(k);
  a.epr = static_cast<int>(epr);
  a.world = world;
  a.experts = experts;
  int64_t blocks = (tokens + kThreads - 1) / kThreads;
  if (blocks > 2 * sms) blocks = 2 * sms;
  if (blocks < 1) blocks = 1;
  a.per_block = (tokens + blocks - 1) / blocks;
  if (a.per_block < 1) a.per_block = 1;
  blocks = (tokens + a.per_block - 1) / a.per_block;  // no block without tokens (but at least one)
  if (blocks < 1) blocks = 1;
  a.blocks = static_cast<int>(blocks);

  char* scratch = static_cast<char*>(args->scratch);
  const int64_t masks_bytes = align16(tokens);
  const int64_t part_rank_bytes = align16(blocks * world * 4);
  const int64_t need = masks_bytes + part_rank_bytes + blocks * experts * 4;
  if (need > args->scratch_bytes) return 6;
  a.masks = reinterpret_cast<uint8_t*>(scratch);
  a.part_rank = reinterpret_cast<int32_t*>(scratch + masks_bytes);
  a.part_expert = reinterpret_cast<int32_t*>(scratch + masks_bytes + part_rank_bytes);

  count_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a);
  scan_kernel<<<1, kScanThreads, 0, stream>>>(a);
  slot_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
