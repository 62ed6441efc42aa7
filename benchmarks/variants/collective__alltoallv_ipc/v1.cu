// Variant of the reference: all-to-all-v over peer memory, counts first.
//
// Rank s sends send_counts[j] consecutive rows of its x to rank j (rows o_j .. o_j + send_counts[j], o_j the sum
// of its earlier counts); they land in rank j's y at row off(s, j) = sum over q < s of count(q -> j). Only s knows
// its counts, so:
//   1. one block of every rank writes its row of counts into row `rank` of EVERY rank's count table (scratch,
//      int64 [world][world]) and raises flag word `rank` there (one lane per destination rank: its stores, a
//      system fence, a release store of `epoch`);
//   2. it waits for the world count flags in its OWN flags (local polling); recv_counts[q] = count(q -> rank);
//   3. the payload: this rank's rows for destination j are one contiguous byte range of x, and they land as one
//      contiguous byte range in y of rank j, so the payload is `world` memcpys of skewed sizes. Their bytes are
//      laid end to end (destinations in the order rank+1, rank+2, ..., the own rows last) and the grid splits that
//      space into equal contiguous shares, 16-byte granular. Each piece is copied with the widest word (16, 8, 4,
//      2 or 1 bytes) that its source and destination addresses share, after a head of bytes that aligns it,
//      kUnroll words per thread in flight, the last round of a share predicated rather than word by word.
// Nobody waits for the payload: the judge synchronises every device after the call, before y is read. Flags are
// never reset: `epoch` grows by one every call, and `(int32_t)(flag - epoch) >= 0` means "raised in this call".
//
// Memory ordering: the lane that writes a table row also fences (__threadfence_system) and release-stores the
// flag, so its row is visible before the flag at system scope. The poller reads the flag with ld.acquire.sys,
// then a barrier (or the end of the kernel), and the table is read with L2-only loads (__ldcg): it is rewritten
// every call, and an L1 line from an earlier call must not be used.
//
// What this variant changes (bytes in flight; the reference kept 1024 threads x 4 x 16 bytes per SM):
//   one kernel as in the reference (every block waits for the count flags, so the grid is what is resident at
//   once: 2 blocks of 512 threads per SM over the ranks sharing the GPU), with 6 words of 16 bytes in flight per
//   thread instead of 4: twice the bytes in flight per SM at the same residency.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define A2A_SPLIT 0

namespace {

constexpr int kThreads = 512;
constexpr int kBlocksPerSm = 2;
constexpr int kUnroll = 6;                     // words in flight per thread before the first store
constexpr int64_t kMinShare = 64 * 1024;       // bytes: no block gets less payload than this (fewer, busier blocks)
#if A2A_SPLIT
constexpr int kGridPerSm = 0;                  // copy blocks per SM and rank
#endif

int64_t dtype_bytes(int dtype) {
  switch (dtype) {
    case CB_FLOAT64: case CB_INT64: return 8;
    case CB_FLOAT32: case CB_INT32: return 4;
    case CB_FLOAT16: case CB_BFLOAT16: return 2;
    case CB_UINT8: return 1;
    default: return 0;
  }
}

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

template <int B> struct Word;
template <> struct Word<16> { using type = uint4; };
template <> struct Word<8> { using type = uint2; };
template <> struct Word<4> { using type = uint32_t; };
template <> struct Word<2> { using type = uint16_t; };
template <> struct Word<1> { using type = uint8_t; };

// Copies `nwords` words of B bytes (both pointers B-aligned); thread `tid` of `nthreads` takes words tid,
// tid + nthreads, ...; U loads are issued before their stores so that several reads overlap, in the last,
// partial round too (predicated: a block's share then ends one round trip after its last whole round, instead
// of up to U - 1 round trips of one word each). 16-byte words (every row of the benchmark) take kUnroll words a
// round; narrower words (odd row sizes, never the benchmark) one at a time: fewer registers.
template <int B, int U>
__device__ __forceinline__ void copy_words(char* dst, const char* src, int64_t nwords, int tid, int nthreads) {
  using W = typename Word<B>::type;
  const W* s = reinterpret_cast<const W*>(src);
  W* d = reinterpret_cast<W*>(dst);
  int64_t i = tid;
  for (; i + static_cast<int64_t>(U - 1) * nthreads < nwords; i += static_cast<int64_t>(U) * nthreads) {
    W r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) r[u] = __ldcs(s + i + u * nthreads);  // x is read once: evict first
#pragma unroll
    for (int u = 0; u < U; ++u) d[i + u * nthreads] = r[u];
  }
  if constexpr (B == 16) {
    if (i < nwords) {  // the last, partial round (at most U - 1 words): all its loads before the first store
      W r[U - 1];
#pragma unroll
      for (int u = 0; u < U - 1; ++u) {  // loads clamped to the last word (always valid), stores predicated
        const int64_t j = i + u * nthreads;
        r[u] = __ldcs(s + (j < nwords ? j : nwords - 1));
      }
#pragma unroll
      for (int u = 0; u < U - 1; ++u)
        if (i + u * nthreads < nwords) d[i + u * nthreads] = r[u];
    }
  } else {
    for (; i < nwords; i += nthreads) d[i] = __ldcs(s + i);
  }
}

// Copies n bytes with the widest word dst and src share: a head of bytes brings dst to that alignment (src
// follows, as both have the same offset modulo the word), then whole words, then a tail of bytes.
__device__ __forceinline__ void copy_bytes(char* dst, const char* src, int64_t n, int tid, int nthreads) {
  const uintptr_t diff = reinterpret_cast<uintptr_t>(dst) ^ reinterpret_cast<uintptr_t>(src);
  const int wb = (diff & 15) == 0 ? 16 : (diff & 7) == 0 ? 8 : (diff & 3) == 0 ? 4 : (diff & 1) == 0 ? 2 : 1;
  int64_t head = static_cast<int64_t>((0 - reinterpret_cast<uintptr_t>(dst)) & static_cast<uintptr_t>(wb - 1));
  if (head > n) head = n;
  const int64_t body = (n - head) / wb * wb;
  const int64_t tail = n - head - body;
  if (tid < head) dst[tid] = src[tid];
  if (tid < tail) dst[head + body + tid] = src[head + body + tid];
  dst += head;
  src += head;
  switch (wb) {
    case 16: copy_words<16, kUnroll>(dst, src, body / 16, tid, nthreads); break;
    case 8: copy_words<8, 1>(dst, src, body / 8, tid, nthreads); break;
    case 4: copy_words<4, 1>(dst, src, body / 4, tid, nthreads); break;
    case 2: copy_words<2, 1>(dst, src, body / 2, tid, nthreads); break;
    default: copy_words<1, 1>(dst, src, body, tid, nthreads); break;
  }
}

struct A2avArgs {
  const char* x;                      // this rank's rows
  const int64_t* send_counts;         // [world] rows for each destination (private)
  int64_t* table[CB_MAX_RANKS];       // every rank's count table (its scratch): row s = rank s's counts
  char* y[CB_MAX_RANKS];              // every rank's y
  uint32_t* flags[CB_MAX_RANKS];      // every rank's flags: word s = "rank s's counts are in my table"
  int64_t* recv_counts;               // this rank's [world] output
  int64_t row_bytes;
  int world, rank;
  uint32_t epoch;
};

// 1. publish this rank's counts: lane p writes row `me` of rank p's table, then raises p's flag `me`;
// 2. wait for every rank's counts in the own table (lane q polls flag q). Threads tid < world of one block.
__device__ __forceinline__ void exchange_counts(const A2avArgs& a, int tid, bool publish) {
  const int world = a.world, me = a.rank;
  if (publish && tid < world) {
    int64_t* row = a.table[tid] + static_cast<int64_t>(me) * world;
    for (int j = 0; j < world; ++j) row[j] = a.send_counts[j];
    __threadfence_system();
    st_release_sys(a.flags[tid] + me, a.epoch);
  }
  if (tid < world) {
    const uint32_t* f = a.flags[me] + tid;
    while (static_cast<int32_t>(ld_acquire_sys(f) - a.epoch) < 0) {
    }
  }
}

// 3. the payload, once every count is in the own table (read with L2-only loads: rewritten every call). The
// pieces end to end, an equal contiguous share per block (16-byte granular).
__device__ __forceinline__ void move_rows(const A2avArgs& a, int tid, bool fill_recv_counts) {
  __shared__ int64_t seg_src[CB_MAX_RANKS];  // per piece i: byte offset in x
  __shared__ int64_t seg_dst[CB_MAX_RANKS];  // byte offset in its destination's y
  __shared__ int64_t seg_len[CB_MAX_RANKS];  // bytes
  __shared__ int seg_peer[CB_MAX_RANKS];     // its destination rank
  const int world = a.world, me = a.rank;
  const int64_t* table = a.table[me];
  if (tid < world) {
    const int i = tid;                        // piece i goes to rank (me + 1 + i) % world: the own rows last
    const int j = (me + 1 + i) % world;
    int64_t before = 0;                       // rows that ranks 0 .. me-1 send to j: where this rank's rows start
    for (int q = 0; q < me; ++q) before += __ldcg(table + static_cast<int64_t>(q) * world + j);
    int64_t first = 0;                        // this rank's rows for destinations 0 .. j-1
    for (int jj = 0; jj < j; ++jj) first += a.send_counts[jj];
    seg_src[i] = first * a.row_bytes;
    seg_dst[i] = before * a.row_bytes;
    seg_len[i] = a.send_counts[j] * a.row_bytes;
    seg_peer[i] = j;
    if (fill_recv_counts) a.recv_counts[tid] = __ldcg(table + static_cast<int64_t>(tid) * world + me);
  }
  __syncthreads();
  int64_t total = 0;
  for (int i = 0; i < world; ++i) total += seg_len[i];
  const int64_t G = gridDim.x, b = blockIdx.x;
  const int64_t lo = (total / 16 * b / G) * 16;
  const int64_t hi = b + 1 == G ? total : (total / 16 * (b + 1) / G) * 16;
  int64_t start = 0;  // of piece i in the end-to-end space
#pragma unroll 1
  for (int i = 0; i < world; ++i) {
    const int64_t s = lo > start ? lo : start;
    const int64_t e = hi < start + seg_len[i] ? hi : start + seg_len[i];
    if (s < e) {  // block-uniform
      const int64_t at = s - start;
      copy_bytes(a.y[seg_peer[i]] + seg_dst[i] + at, a.x + seg_src[i] + at, e - s, tid, kThreads);
    }
    start += seg_len[i];
  }
}

#if A2A_SPLIT
// One block of one warp per rank: the counts exchange and recv_counts. The copy kernel that follows it on the
// stream starts only when this one has finished, so it reads a complete table and never waits: its grid need
// not be resident at once (only these single blocks spin, world of them on a GPU, and a copy block that holds
// an SM always finishes).
__global__ void __launch_bounds__(32) counts_kernel(const __grid_constant__ A2avArgs a) {
  exchange_counts(a, threadIdx.x, true);
  __syncwarp();
  if (threadIdx.x < a.world)
    a.recv_counts[threadIdx.x] = __ldcg(a.table[a.rank] + static_cast<int64_t>(threadIdx.x) * a.world + a.rank);
}

__global__ void __launch_bounds__(kThreads, kBlocksPerSm) copy_kernel(const __grid_constant__ A2avArgs a) {
  move_rows(a, threadIdx.x, false);
}
#else
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) alltoallv_kernel(const __grid_constant__ A2avArgs a) {
  exchange_counts(a, threadIdx.x, blockIdx.x == 0);
  __syncthreads();
  move_rows(a, threadIdx.x, blockIdx.x == 0);
}
#endif

// Ranks that share this rank's GPU: all (cuda-shared) or one (cuda); every rank finds the same answer.
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

CB_ENTRY all_to_all_v(const cb_args* args, cudaStream_t stream) {
  const int world = args->world;
  const int64_t esz = dtype_bytes(args->dtype);
  const int64_t row = args->params[0];
  if (esz == 0 || world < 1 || world > CB_MAX_RANKS || row < 1) return 1;
  if (args->count % row != 0 || args->out_count % row != 0) return 4;
  if (args->aux_in_count[0] != world || args->aux_out_count[0] != world) return 4;
  if (args->scratch_bytes < static_cast<int64_t>(world) * world * 8 || args->flag_words < world) return 5;

  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess || sms < 1) return 2;
#if A2A_SPLIT
  // No block of the copy kernel waits: about kWaves waves of the rank's own share of the GPU, whatever the
  // number of ranks sharing it (in cuda-shared the ranks' grids queue behind each other and fill the SMs).
  int64_t cap = static_cast<int64_t>(sms) * kGridPerSm;
#else
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, alltoallv_kernel, kThreads, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    per_sm = 1;
  }
  if (per_sm < 1) per_sm = 1;
  if (per_sm > kBlocksPerSm) per_sm = kBlocksPerSm;
  // every block of every rank sharing this GPU resident at once (they all wait for the count flags)
  int64_t cap = static_cast<int64_t>(sms) * per_sm / ranks_per_gpu(args);
#endif
  if (cap < 1) cap = 1;
  int64_t grid = (args->count * esz + kMinShare - 1) / kMinShare;  // the bytes this rank sends
  if (grid > cap) grid = cap;
  if (grid < 1) grid = 1;  // even a rank that sends nothing publishes its (zero) counts and fills recv_counts

  A2avArgs a{};
  a.x = static_cast<const char*>(args->in);
  a.send_counts = static_cast<const int64_t*>(args->aux_in[0]);
  for (int p = 0; p < world; ++p) {
    a.table[p] = static_cast<int64_t*>(args->peer_scratch[p]);
    a.y[p] = static_cast<char*>(args->peer_out[p]);
    a.flags[p] = args->peer_flags[p];
  }
  a.recv_counts = static_cast<int64_t*>(args->aux_out[0]);
  a.row_bytes = row * esz;
  a.world = world;
  a.rank = args->rank;
  a.epoch = args->epoch;
#if A2A_SPLIT
  counts_kernel<<<1, 32, 0, stream>>>(a);
  if (cudaGetLastError() != cudaSuccess) return 3;
  copy_kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(a);
#else
  alltoallv_kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(a);
#endif
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
