// Reference: MoE token dispatch over peer pointers (the intranode dispatch of DeepEP, in two kernels).
//
// Rank s sends token i to every rank r that hosts one of its experts, straight into r's recv_x at row
//   off(s, r) + slot(i, r),   off(s, r) = sum over s' < s of cnt[s'][r],   slot(i, r) = tokens before i sent to r,
// so every receiver gets its rows ordered by (source rank, token index) with no sorting and no atomics.
//   1. notify (1 block of 1024 threads): one thread per token builds its rank mask from topk_idx; a ballot per
//      rank and a scan over the 32 warps give slot(i, r) (kept in scratch); a shared histogram counts entries per
//      expert. The block then writes its row of counts into EVERY rank's count table, the row for rank p being
//      [cnt[s][0 .. world), entries for each of p's local experts], and raises flag s on every rank.
//   2. dispatch (G blocks of 512): every block waits for the count rows of all ranks, derives off(s, r) and n
//      (the rows this rank receives); then one warp per token loads the token once (16-byte words where the row
//      size allows, 4 in flight per lane) and stores it to each destination's recv_x, and writes the token index
//      and its top-k ids made local to the destination into the destination's staging area in scratch. Meanwhile
//      the tail of the own recv_x (rows n .. world*T) is zeroed. Each block then raises its "done" flag on every
//      rank, waits until every block of every rank has raised its flag here, and copies the staged metadata of
//      the rows it received into recv_src_idx / recv_topk_idx (-1 beyond n).
//
// Flags: words [0, world) are the notify flags (word s: source s), words [world, world + world * G) the done
// flags (word world + s * G + b: block b of source s). A writer makes its stores visible first (__syncthreads(),
// then the signalling thread's __threadfence_system()) and stores `epoch` with st.release.sys; a waiter polls
// its own words with ld.acquire.sys until flag - epoch >= 0, then __syncthreads(), and reads the protected data
// with ld.global.cg (L2, never a stale L1 line). Flags are never reset: epoch grows by one every call. The judge
// synchronises every device between calls, so a count row or staged row is never overwritten while still read.
//
// Deadlock freedom: notify never waits. Dispatch blocks wait, so every block of every rank must be resident at
// once: one block per SM is guaranteed by __launch_bounds__(512, 1); with one GPU per rank G <= the SM count,
// and when the ranks share a GPU G <= SMs / (2 * world), leaving the other half of the SMs for the notify blocks.
// G depends only on T and the GPU, so every rank uses the same G (the receiver counts done flags by it).
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kNotifyThreads = 1024;
constexpr int kNotifyWarps = kNotifyThreads / 32;
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxExperts = 1024;
constexpr unsigned kFull = 0xffffffffu;

int64_t dtype_bytes(int dtype) {
  switch (dtype) {
    case CB_FLOAT64: return 8;
    case CB_FLOAT32: return 4;
    case CB_FLOAT16: case CB_BFLOAT16: return 2;
    default: return 0;
  }
}

template <int B> struct Word;
template <> struct Word<16> { using type = uint4; };
template <> struct Word<8> { using type = uint2; };
template <> struct Word<4> { using type = uint32_t; };
template <> struct Word<2> { using type = uint16_t; };
template <> struct Word<1> { using type = uint8_t; };

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void wait_flag(const uint32_t* p, uint32_t epoch) {
  while (static_cast<int32_t>(ld_acquire_sys(p) - epoch) < 0) {
  }
}

// Scratch of every rank, in bytes (the same offsets everywhere: T, k, world and experts_per_rank are the same).
struct Layout {
  int64_t counts;     // int32 [world sources][world + epr]: written by every source's notify
  int64_t slots;      // int32 [T][world]: slot(i, r) of this rank's tokens, -1 where not sent
  int64_t meta_src;   // int32 [world * T]: token index of each received row (staged by the senders)
  int64_t meta_topk;  // int32 [world * T][k]: local top-k ids of each received row (staged by the senders)
  int64_t total;
};

int64_t align16(int64_t n) { return (n + 15) / 16 * 16; }

Layout layout_of(int64_t tokens, int64_t k, int world, int64_t epr) {
  Layout l{};
  l.counts = 0;
  l.slots = align16(static_cast<int64_t>(world) * (world + epr) * 4);
  l.meta_src = l.slots + align16(tokens * world * 4);
  l.meta_topk = l.meta_src + align16(static_cast<int64_t>(world) * tokens * 4);
  l.total = l.meta_topk + align16(static_cast<int64_t>(world) * tokens * k * 4);
  return l;
}

struct NotifyArgs {
  const int64_t* topk;               // [T, k]
  int32_t* slots;                    // own scratch
  int32_t* counts[CB_MAX_RANKS];     // every rank's count table
  uint32_t* flags[CB_MAX_RANKS];     // every rank's flag words
  int64_t tokens;
  int k, epr, world, rank;
  uint32_t epoch;
};

__global__ void __launch_bounds__(kNotifyThreads) notify_kernel(const __grid_constant__ NotifyArgs a) {
  __shared__ int hist[kMaxExperts];
  __shared__ int warp_base[kNotifyWarps][CB_MAX_RANKS];
  __shared__ int carry[CB_MAX_RANKS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned below = (1u << lane) - 1u;
  const int experts = a.world * a.epr;
  for (int e = tid; e < experts; e += kNotifyThreads) hist[e] = 0;
  if (tid < CB_MAX_RANKS) carry[tid] = 0;
  __syncthreads();

  for (int64_t base = 0; base < a.tokens; base += kNotifyThreads) {  // the same rounds for every thread
    const int64_t i = base + tid;
    uint32_t mask = 0;
    if (i < a.tokens) {
      for (int j = 0; j < a.k; ++j) {
        const int64_t e = a.topk[i * a.k + j];
        if (e >= 0 && e < experts) {
          mask |= 1u << static_cast<int>(e / a.epr);
          atomicAdd(&hist[e], 1);
        }
      }
    }
    int pre[CB_MAX_RANKS];
#pragma unroll
    for (int r = 0; r < CB_MAX_RANKS; ++r) {
      const unsigned b = __ballot_sync(kFull, (mask >> r) & 1u);
      pre[r] = __popc(b & below);
      if (lane == 0) warp_base[warp][r] = __popc(b);
    }
    __syncthreads();
    if (tid < a.world) {
      int run = carry[tid];
      for (int w = 0; w < kNotifyWarps; ++w) {
        const int t = warp_base[w][tid];
        warp_base[w][tid] = run;
        run += t;
      }
      carry[tid] = run;
    }
    __syncthreads();
    if (i < a.tokens) {
#pragma unroll
      for (int r = 0; r < CB_MAX_RANKS; ++r)
        if (r < a.world) a.slots[i * a.world + r] = ((mask >> r) & 1u) ? warp_base[warp][r] + pre[r] : -1;
    }
    __syncthreads();
  }

  // carry[r] = tokens sent to r; hist[e] = entries for expert e. Row `rank` of every rank's count table.
  const int row = a.world + a.epr;
  for (int idx = tid; idx < a.world * row; idx += kNotifyThreads) {
    const int p = idx / row, q = idx - p * row;
    a.counts[p][a.rank * row + q] = q < a.world ? carry[q] : hist[p * a.epr + (q - a.world)];
  }
  __syncthreads();
  if (tid < a.world) {
    __threadfence_system();
    st_release_sys(a.flags[tid] + a.rank, a.epoch);
  }
}

struct DispatchArgs {
  const char* x;                      // [T, d] this rank's tokens
  const int64_t* topk;                // [T, k]
  const int32_t* slots;               // own scratch, from notify
  const int32_t* counts;              // own count table (rows written by every source)
  char* out[CB_MAX_RANKS];            // every rank's recv_x
  int32_t* meta_src[CB_MAX_RANKS];    // every rank's staging areas
  int32_t* meta_topk[CB_MAX_RANKS];
  uint32_t* flags[CB_MAX_RANKS];
  int32_t* recv_src;                  // own outputs
  int32_t* recv_topk;
  int32_t* recv_counts;
  int32_t* recv_per_expert;
  int64_t tokens;
  int64_t row_bytes;
  int k, epr, world, rank;
  uint32_t epoch;
};

template <int W>
__global__ void __launch_bounds__(kThreads, 1) dispatch_kernel(const __grid_constant__ DispatchArgs a) {
  using Wd = typename Word<W>::type;
  __shared__ int off[CB_MAX_RANKS];
  __shared__ int recv_rows;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int row = a.world + a.epr;
  const int64_t gtid = static_cast<int64_t>(blockIdx.x) * kThreads + tid;
  const int64_t gthreads = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t cap = static_cast<int64_t>(a.world) * a.tokens;
  const int64_t nwords = a.row_bytes / W;

  // 1. every source's counts
  if (tid < a.world) wait_flag(a.flags[a.rank] + tid, a.epoch);
  __syncthreads();
  if (tid < CB_MAX_RANKS) {
    int o = 0;
    if (tid < a.world)
      for (int s = 0; s < a.rank; ++s) o += __ldcg(a.counts + s * row + tid);
    off[tid] = o;  // where this rank's rows start in rank tid's recv_x
  }
  if (tid == 0) {
    int n = 0;
    for (int s = 0; s < a.world; ++s) n += __ldcg(a.counts + s * row + a.rank);
    recv_rows = n;
  }
  __syncthreads();
  const int64_t n_recv = recv_rows;

  // 2. payload and metadata, one warp per token
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + warp; i < a.tokens; i += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int my_slot = lane < a.world ? a.slots[i * a.world + lane] : -1;
    const unsigned dests = __ballot_sync(kFull, my_slot >= 0);
    if (dests == 0u) continue;  // warp-uniform: a token routed nowhere
    int64_t dst_row[CB_MAX_RANKS];
#pragma unroll
    for (int r = 0; r < CB_MAX_RANKS; ++r) {
      const int s = __shfl_sync(kFull, my_slot, r);
      dst_row[r] = ((dests >> r) & 1u) ? off[r] + static_cast<int64_t>(s) : -1;
    }
    for (int j = lane; j < a.k; j += 32) {
      const int64_t e = a.topk[i * a.k + j];
      const int owner = e >= 0 ? static_cast<int>(e / a.epr) : -1;
#pragma unroll
      for (int r = 0; r < CB_MAX_RANKS; ++r)
        if (dst_row[r] >= 0)
          a.meta_topk[r][dst_row[r] * a.k + j] = owner == r ? static_cast<int32_t>(e - static_cast<int64_t>(r) * a.epr) : -1;
    }
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < CB_MAX_RANKS; ++r)
        if (dst_row[r] >= 0) a.meta_src[r][dst_row[r]] = static_cast<int32_t>(i);
    }
    const Wd* src = reinterpret_cast<const Wd*>(a.x + i * a.row_bytes);
    Wd* dst[CB_MAX_RANKS];
#pragma unroll
    for (int r = 0; r < CB_MAX_RANKS; ++r)
      dst[r] = dst_row[r] >= 0 ? reinterpret_cast<Wd*>(a.out[r] + dst_row[r] * a.row_bytes) : nullptr;
    int64_t w = lane;
    for (; w + 3 * 32 < nwords; w += 4 * 32) {
      Wd v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = src[w + u * 32];
#pragma unroll
      for (int r = 0; r < CB_MAX_RANKS; ++r)
        if (dst[r] != nullptr) {
#pragma unroll
          for (int u = 0; u < 4; ++u) dst[r][w + u * 32] = v[u];
        }
    }
    for (; w < nwords; w += 32) {
      const Wd v = src[w];
#pragma unroll
      for (int r = 0; r < CB_MAX_RANKS; ++r)
        if (dst[r] != nullptr) dst[r][w] = v;
    }
  }

  // 3. the own tail (rows n .. cap) and counts: local, known since step 1
  {
    Wd* tail = reinterpret_cast<Wd*>(a.out[a.rank] + n_recv * a.row_bytes);
    const int64_t tail_words = (cap - n_recv) * nwords;
    const Wd zero{};
    for (int64_t q = gtid; q < tail_words; q += gthreads) tail[q] = zero;
    for (int64_t q = n_recv + gtid; q < cap; q += gthreads) a.recv_src[q] = -1;
    for (int64_t q = n_recv * a.k + gtid; q < cap * a.k; q += gthreads) a.recv_topk[q] = -1;
    if (blockIdx.x == 0) {
      if (tid < a.world) a.recv_counts[tid] = __ldcg(a.counts + tid * row + a.rank);
      for (int e = tid; e < a.epr; e += kThreads) {
        int s = 0;
        for (int p = 0; p < a.world; ++p) s += __ldcg(a.counts + p * row + a.world + e);
        a.recv_per_expert[e] = s;
      }
    }
  }

  // 4. done: this block's rows are in every destination
  __syncthreads();
  if (tid < a.world) {
    __threadfence_system();
    st_release_sys(a.flags[tid] + a.world + a.rank * static_cast<int>(gridDim.x) + blockIdx.x, a.epoch);
  }

  // 5. once every block of every source is done, the staged metadata of the received rows is complete
  const uint32_t* done = a.flags[a.rank] + a.world;
  for (int q = tid; q < a.world * static_cast<int>(gridDim.x); q += kThreads) wait_flag(done + q, a.epoch);
  __syncthreads();
  const int32_t* ms = a.meta_src[a.rank];
  const int32_t* mt = a.meta_topk[a.rank];
  for (int64_t q = gtid; q < n_recv; q += gthreads) a.recv_src[q] = __ldcg(ms + q);
  for (int64_t q = gtid; q < n_recv * a.k; q += gthreads) a.recv_topk[q] = __ldcg(mt + q);
}

// Ranks that share this rank's GPU: the judge puts either every rank on one GPU (cuda-shared) or one rank on
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

template <int W>
void launch_dispatch(const DispatchArgs& d, int64_t grid, cudaStream_t stream) {
  dispatch_kernel<W><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(d);
}

}  // namespace

CB_ENTRY dispatch(const cb_args* args, cudaStream_t stream) {
  const int world = args->world;
  const int64_t esz = dtype_bytes(args->dtype);
  const int64_t epr = args->params[0], k = args->params[1];
  if (esz == 0 || world < 1 || world > CB_MAX_RANKS || epr < 1 || k < 1 || world * epr > kMaxExperts) return 1;
  if (args->aux_in_count[0] % k != 0) return 4;
  const int64_t tokens = args->aux_in_count[0] / k;
  if (tokens < 1 || args->count % tokens != 0) return 4;
  const int64_t d = args->count / tokens;
  const int64_t cap = world * tokens;
  if (args->out_count != cap * d || args->aux_out_count[0] != cap || args->aux_out_count[1] != cap * k ||
      args->aux_out_count[2] != world || args->aux_out_count[3] != epr)
    return 4;
  const Layout l = layout_of(tokens, k, world, epr);
  if (l.total > args->scratch_bytes) return 6;

  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  const int rpg = ranks_per_gpu(args);
  int64_t grid = (tokens + kWarps - 1) / kWarps;  // a warp per token
  const int64_t resident = rpg > 1 ? sms / (2 * rpg) : sms;
  if (grid > resident) grid = resident;
  if (grid > (args->flag_words - world) / world) grid = (args->flag_words - world) / world;
  if (grid < 1) return 5;  // too few SMs or flag words for even one block

  NotifyArgs n{};
  n.topk = static_cast<const int64_t*>(args->aux_in[0]);
  n.slots = reinterpret_cast<int32_t*>(static_cast<char*>(args->scratch) + l.slots);
  for (int p = 0; p < world; ++p) {
    n.counts[p] = reinterpret_cast<int32_t*>(static_cast<char*>(args->peer_scratch[p]) + l.counts);
    n.flags[p] = args->peer_flags[p];
  }
  n.tokens = tokens;
  n.k = static_cast<int>(k);
  n.epr = static_cast<int>(epr);
  n.world = world;
  n.rank = args->rank;
  n.epoch = args->epoch;

  DispatchArgs a{};
  a.x = static_cast<const char*>(args->in);
  a.topk = n.topk;
  a.slots = n.slots;
  a.counts = n.counts[args->rank];
  uintptr_t bits = static_cast<uintptr_t>(d * esz) | reinterpret_cast<uintptr_t>(args->in);
  for (int p = 0; p < world; ++p) {
    char* ps = static_cast<char*>(args->peer_scratch[p]);
    a.out[p] = static_cast<char*>(args->peer_out[p]);
    a.meta_src[p] = reinterpret_cast<int32_t*>(ps + l.meta_src);
    a.meta_topk[p] = reinterpret_cast<int32_t*>(ps + l.meta_topk);
    a.flags[p] = args->peer_flags[p];
    bits |= reinterpret_cast<uintptr_t>(args->peer_out[p]);
  }
  a.recv_src = static_cast<int32_t*>(args->aux_out[0]);
  a.recv_topk = static_cast<int32_t*>(args->aux_out[1]);
  a.recv_counts = static_cast<int32_t*>(args->aux_out[2]);
  a.recv_per_expert = static_cast<int32_t*>(args->aux_out[3]);
  a.tokens = tokens;
  a.row_bytes = d * esz;
  a.k = n.k;
  a.epr = n.epr;
  a.world = world;
  a.rank = args->rank;
  a.epoch = args->epoch;

  notify_kernel<<<1, kNotifyThreads, 0, stream>>>(n);
  // the widest word that divides the row size, the own x and every destination's recv_x
  if ((bits & 15) == 0) launch_dispatch<16>(a, grid, stream);
  else if ((bits & 7) == 0) launch_dispatch<8>(a, grid, stream);
  else if ((bits & 3) == 0) launch_dispatch<4>(a, grid, stream);
  else if ((bits & 1) == 0) launch_dispatch<2>(a, grid, stream);
  else launch_dispatch<1>(a, grid, stream);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
