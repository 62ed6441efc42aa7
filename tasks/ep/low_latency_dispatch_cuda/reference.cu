// Reference: low-latency MoE dispatch into fixed per-(local expert, source rank) slots, in ONE kernel per rank
// (the layout of DeepEP's low-latency mode; no layout exchange before the payload moves).
//
// Rank s, local expert l of rank r: the slot (l, s) is rows [s * M, (s + 1) * M) of r's recv_x[l]; token i of s
// with expert e = r * epr + l lands at row pos(i, e) of that slot, pos(i, e) = the tokens i' < i of s that chose
// e. So every row's place is known to its sender alone, and the only things a receiver must learn are how many
// rows each slot holds and which token each row is. The G blocks of every rank split its T tokens into G
// contiguous ranges. Every block, as a sender:
//   1. counts the entries of the tokens before its range per expert (shared-memory histogram), then walks its
//      own tokens in order (one warp, one lane per top-k entry: the experts of a row are distinct) to give each
//      entry its pos; the last block's histogram then holds every expert's count, and it sends each count to the
//      expert's owner as one 8-byte LL word {count, epoch} (no fence: the word carries its own flag);
//   2. writes each entry's token index into the owner's scratch table (slot, pos), and raises its done flag
//      (s, b) on every rank (__syncthreads, __threadfence_system, st.release.sys), BEFORE moving any payload:
//      the receivers' last step never waits for a payload;
//   3. copies its tokens: one warp per (token, 2 KiB chunk), each chunk loaded once (16-byte words where the row
//      size and the pointers allow, 4 per lane in flight) and stored into every destination slot row.
// Then, as a receiver:
//   4. polls the count words of all its epr * world slots (its own scratch), writes recv_count, and zeroes the
//      padding rows of every slot (rows count .. M-1) and sets their recv_src_idx to -1, grid-stride, while the
//      payload is still arriving;
//   5. waits for the done flags of every block of every rank and copies the table rows below each count into
//      recv_src_idx.
//
// Latency: with few tokens the call is a handful of dependent steps: the count words leave within the first
// microsecond (step 1 needs only topk_idx), and the receivers' steps 4-5 overlap the senders' payload copies, so
// the floor is one flag round trip plus the payload's copy time. Target on one H200 (cuda-shared): under 10 us
// at M = 16 tokens of 14 KiB, about the payload copy time plus 3 us at M = 128 (the whole receive buffers,
// epr * world * M rows per rank, are written either way: payload rows by the senders, padding by the receiver).
//
// Memory ordering: the count words are LL words (value and epoch in one aligned 8-byte store, read with volatile
// 8-byte loads). The table is protected by the done flags: writers' stores, __syncthreads(), then one thread's
// __threadfence_system() and st.release.sys of `epoch`; the receiver polls with ld.acquire.sys until
// flag - epoch >= 0, __syncthreads(), and reads the table with ld.global.cg. Nothing is ever reset: epochs grow
// by one per call, and the judge synchronises every device between calls, so nothing is overwritten while read.
//
// Deadlock freedom: every block sends everything (steps 1-3) before it waits for anything (steps 4-5), so all
// waits end once every block of every rank has started: all blocks must be resident together. One block per SM
// always fits (__launch_bounds__(512, 1), under 48 KiB of shared memory), and G = SMs / (ranks on this GPU); G
// depends only on the GPU and world (never on T, which is private), so every rank computes the same G.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;           // words per lane per unit: 2 KiB per warp in flight with 16-byte words
constexpr int kMaxExperts = 1024;    // E = world * epr
constexpr int kMaxTokens = 1024;     // M
constexpr int kPosBits = 16;         // an entry's code: (expert << 16) | pos

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
template <> struct Word<4> { using type = unsigned int; };
template <> struct Word<2> { using type = unsigned short; };

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void st_word(uint64_t* p, uint64_t v) {
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t ld_word(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Scratch of every rank (the same offsets everywhere): count words, then the token-index table.
struct Layout {
  int64_t counts;  // uint64 [epr * world]: {count, epoch} of slot q = l * world + s, written by rank s
  int64_t table;   // int32 [epr * world * M]: token index of row (q, pos), written by rank s
  int64_t total;
};

Layout layout_of(int64_t slots, int64_t m) {
  Layout l{};
  l.counts = 0;
  l.table = (8 * slots + 15) / 16 * 16;
  l.total = l.table + 4 * slots * m;
  return l;
}

struct LLArgs {
  const char* x;                 // [T, d] of this rank
  const int64_t* topk;           // [T, k]
  char* out[CB_MAX_RANKS];       // every rank's recv_x [epr, world * M, d]
  uint64_t* counts[CB_MAX_RANKS];
  int32_t* table[CB_MAX_RANKS];
  uint32_t* flags[CB_MAX_RANKS];
  int64_t* recv_count;           // this rank's [epr, world]
  int64_t* recv_src;             // this rank's [epr, world * M]
  int64_t tokens;                // T of this rank
  int64_t m;                     // M
  int64_t row_bytes;
  int k, epr, world, rank;
  uint32_t epoch;
};

template <int W>
__global__ void __launch_bounds__(kThreads, 1) ll_dispatch_kernel(const __grid_constant__ LLArgs a) {
  using Wd = typename Word<W>::type;
  extern __shared__ int32_t sm[];  // hist [E], then codes [own tokens * k]
  __shared__ int32_t slot_count[kMaxExperts];  // receiver: count of slot q = l * world + s
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int G = gridDim.x, b = blockIdx.x;
  const int world = a.world, k = a.k, epr = a.epr;
  const int experts = world * epr;
  const int64_t m = a.m;
  int32_t* hist = sm;
  int32_t* codes = sm + experts;
  const int64_t t_lo = a.tokens * b / G, t_hi = a.tokens * (b + 1) / G;
  const int own = static_cast<int>(t_hi - t_lo);

  // 1. positions: histogram of the entries before t_lo, then the own tokens in order
  for (int i = tid; i < experts; i += kThreads) hist[i] = 0;
  __syncthreads();
  for (int64_t q = tid; q < t_lo * k; q += kThreads) {
    const int64_t e = a.topk[q];
    if (e >= 0 && e < experts) atomicAdd(&hist[e], 1);
  }
  for (int q = tid; q < own * k; q += kThreads) {
    const int64_t e = a.topk[t_lo * k + q];
    codes[q] = (e >= 0 && e < experts) ? static_cast<int32_t>(e) : -1;
  }
  __syncthreads();
  if (warp == 0) {
    for (int i = 0; i < own; ++i) {
      for (int j = lane; j < k; j += 32) {  // k <= 32: one round; the experts of a row are distinct
        const int e = codes[i * k + j];
        if (e >= 0) {
          const int pos = hist[e];
          hist[e] = pos + 1;
          codes[i * k + j] = (e << kPosBits) | pos;
        }
      }
      __syncwarp();  // this token's counts before the next token reads them
    }
  }
  __syncthreads();
  if (b == G - 1) {  // hist now counts the entries of every token: each expert's count to its owner
    for (int e = tid; e < experts; e += kThreads) {
      const int r = e / epr, l = e - r * epr;
      const uint64_t w = (static_cast<uint64_t>(a.epoch) << 32) | static_cast<uint32_t>(hist[e]);
      st_word(a.counts[r] + l * world + a.rank, w);
    }
  }

  // 2. the token index of every own entry into its owner's table, then done flag (rank, b) everywhere
  for (int q = tid; q < own * k; q += kThreads) {
    const int c = codes[q];
    if (c >= 0) {
      const int e = c >> kPosBits, pos = c & ((1 << kPosBits) - 1);
      const int r = e / epr, l = e - r * epr;
      a.table[r][(static_cast<int64_t>(l) * world + a.rank) * m + pos] = static_cast<int32_t>(t_lo + q / k);
    }
  }
  __syncthreads();
  if (tid < world) {
    __threadfence_system();
    st_release_sys(a.flags[tid] + a.rank * G + b, a.epoch);
  }

  // 3. payload: one warp per (token, chunk of 32 * kUnroll words), each chunk loaded once, stored k times
  const int64_t nwords = a.row_bytes / W;
  {
    const int64_t chunk = 32 * kUnroll;
    const int64_t upt = (nwords + chunk - 1) / chunk;  // units per token
    for (int64_t u = warp; u < own * upt; u += kWarps) {
      const int i = static_cast<int>(u / upt);
      const int64_t w0 = (u % upt) * chunk + lane;
      const Wd* src = reinterpret_cast<const Wd*>(a.x + (t_lo + i) * a.row_bytes);
      Wd v[kUnroll];
#pragma unroll
      for (int q = 0; q < kUnroll; ++q)
        if (w0 + q * 32 < nwords) v[q] = __ldcs(src + w0 + q * 32);  // read once: evict first
      for (int j = 0; j < k; ++j) {
        const int c = codes[i * k + j];  // the same word for the whole warp: a broadcast
        if (c < 0) continue;
        const int e = c >> kPosBits, pos = c & ((1 << kPosBits) - 1);
        const int r = e / epr, l = e - r * epr;
        Wd* dst = reinterpret_cast<Wd*>(a.out[r] + ((static_cast<int64_t>(l) * world + a.rank) * m + pos) * a.row_bytes);
#pragma unroll
        for (int q = 0; q < kUnroll; ++q)
          if (w0 + q * 32 < nwords) dst[w0 + q * 32] = v[q];
      }
    }
  }

  // 4. receiver: every slot's count, recv_count, and the padding of every slot (zero rows, -1 indices)
  const int slots = experts;  // epr local experts x world sources
  for (int q = tid; q < slots; q += kThreads) {
    const uint64_t* line = a.counts[a.rank] + q;
    uint64_t w = ld_word(line);
    while (static_cast<uint32_t>(w >> 32) != a.epoch) w = ld_word(line);
    const int32_t c = static_cast<int32_t>(static_cast<uint32_t>(w));
    slot_count[q] = c;
    if (b == 0) a.recv_count[q] = c;
  }
  __syncthreads();
  {
    char* own_out = a.out[a.rank];
    const Wd zero{};
    for (int64_t u = static_cast<int64_t>(b) * kWarps + warp; u < slots * m; u += static_cast<int64_t>(G) * kWarps) {
      const int q = static_cast<int>(u / m);
      const int64_t row = u - q * m;
      if (row < slot_count[q]) continue;  // warp-uniform: a row that a sender fills
      Wd* dst = reinterpret_cast<Wd*>(own_out + u * a.row_bytes);
      for (int64_t w = lane; w < nwords; w += 32) dst[w] = zero;
      if (lane == 0) a.recv_src[u] = -1;
    }
  }

  // 5. every block of every rank has written its table entries here (step 2): copy them out
  for (int q = tid; q < world * G; q += kThreads)
    while (static_cast<int32_t>(ld_acquire_sys(a.flags[a.rank] + q) - a.epoch) < 0) __nanosleep(32);
  __syncthreads();
  const int32_t* table = a.table[a.rank];
  for (int64_t u = static_cast<int64_t>(b) * kThreads + tid; u < slots * m; u += static_cast<int64_t>(G) * kThreads) {
    const int q = static_cast<int>(u / m);
    if (u - q * m < slot_count[q]) a.recv_src[u] = __ldcg(table + u);
  }
}

// Ranks that share this rank's GPU: all of them (cuda-shared) or one (cuda); every rank computes the same.
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
void launch(const LLArgs& d, int grid, size_t smem, cudaStream_t stream) {
  ll_dispatch_kernel<W><<<grid, kThreads, smem, stream>>>(d);
}

}  // namespace

CB_ENTRY low_latency_dispatch(const cb_args* args, cudaStream_t stream) {
  const int world = args->world;
  const int64_t esz = dtype_bytes(args->dtype);
  const int64_t epr = args->params[0], k = args->params[1];
  if (esz == 0 || world < 1 || world > CB_MAX_RANKS || epr < 1 || k < 1 || k > 32 || world * epr > kMaxExperts)
    return 1;
  const int64_t slots = world * epr;
  if (args->aux_out_count[0] != slots || args->aux_out_count[1] % slots != 0) return 4;
  const int64_t m = args->aux_out_count[1] / slots;
  if (m < 1 || m > kMaxTokens || args->out_count % args->aux_out_count[1] != 0) return 4;
  const int64_t d = args->out_count / args->aux_out_count[1];
  if (d < 1 || args->aux_in_count[0] % k != 0) return 4;
  const int64_t tokens = args->aux_in_count[0] / k;
  if (tokens > m || args->count != tokens * d) return 4;
  const Layout l = layout_of(slots, m);
  if (args->scratch_bytes < l.total) return 5;

  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  int64_t grid = sms / ranks_per_gpu(args);
  if (grid > args->flag_words / world) grid = args->flag_words / world;
  if (grid < 1) return 5;
  const int64_t own_max = (m + grid - 1) / grid;  // the most tokens a block can own (T <= M)
  const size_t smem = static_cast<size_t>(slots + own_max * k) * sizeof(int32_t);
  if (smem > 44 * 1024) return 5;  // stays under the 48 KiB default with the static slot counts

  LLArgs a{};
  a.x = static_cast<const char*>(args->in);
  a.topk = static_cast<const int64_t*>(args->aux_in[0]);
  uintptr_t bits = static_cast<uintptr_t>(d * esz) | reinterpret_cast<uintptr_t>(args->in);
  for (int p = 0; p < world; ++p) {
    char* ps = static_cast<char*>(args->peer_scratch[p]);
    a.out[p] = static_cast<char*>(args->peer_out[p]);
    a.counts[p] = reinterpret_cast<uint64_t*>(ps + l.counts);
    a.table[p] = reinterpret_cast<int32_t*>(ps + l.table);
    a.flags[p] = args->peer_flags[p];
    bits |= reinterpret_cast<uintptr_t>(args->peer_out[p]);
  }
  a.recv_count = static_cast<int64_t*>(args->aux_out[0]);
  a.recv_src = static_cast<int64_t*>(args->aux_out[1]);
  a.tokens = tokens;
  a.m = m;
  a.row_bytes = d * esz;
  a.k = static_cast<int>(k);
  a.epr = static_cast<int>(epr);
  a.world = world;
  a.rank = args->rank;
  a.epoch = args->epoch;

  // the widest word that divides the row size, the own x and every rank's recv_x (elements are >= 2 bytes)
  const int g = static_cast<int>(grid);
  if ((bits & 15) == 0) launch<16>(a, g, smem, stream);
  else if ((bits & 7) == 0) launch<8>(a, g, smem, stream);
  else if ((bits & 3) == 0) launch<4>(a, g, smem, stream);
  else launch<2>(a, g, smem, stream);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
