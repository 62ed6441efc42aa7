// Reference: a vocabulary-parallel embedding lookup fused with its all-reduce, in ONE kernel per rank and no
// flags.
//
// Megatron's VocabParallelEmbedding looks every token up in the own shard (zero rows for the ids other ranks own)
// and all-reduces [T, d]: world x T rows of which all but T are zeros, summed. Here every row has exactly one
// owner and every rank knows it (the ids and the vocabulary's split are the same on every rank), so the sum is a
// copy: the owner of ids[i] loads row ids[i] - lo of its shard once and stores it into row i of EVERY rank's out
// (its own included). No zero row is ever written or read, nothing is added, and no rank waits for another: row
// i of each out is written by exactly one rank, and the judge synchronises every device after the call. Rows of
// padding ids (-1) have no owner: each rank zero-fills them in its own out.
//
// Work: one warp per (token, chunk of 32 x kUnroll words) unit, grid-stride over all T x chunks units; a warp
// reads the token's id (one broadcast load), skips the unit unless its rank owns the id, loads the chunk (kUnroll
// independent loads per lane in flight) and stores it to the world destinations, starting with the next rank so
// that the ranks do not all write to one GPU at once. Words are 16 bytes where the row size, the shard and every
// out allow (d = 4096 bf16: 8 KiB rows, 4 chunks of 2 KiB), else 8, 4, 2 or 1 bytes. Table rows are read through
// the read-only path (hot ids repeat rows: they may hit in L1 or L2).
//
// Bound (cuda-shared, HBM). With B = T * d * elt (the metric's size, one rank's out): all ranks together read B
// (each row once, by its owner) and write world * B (every out), (world + 1) * B in all, where a copy of B moves
// 2 B. The judge's roofline is each rank's share of the device copy rate C (C / world, C counting each byte once
// though it is read and written), so algbw = B / t can reach 2 * world / (world + 1) of it: 133 % at world 2,
// 160 % at world 4, 178 % at world 8 (the balanced case; every id on one shard makes one rank do all the
// reads). Target: 85 % of that, i.e. about 113 / 136 / 151 % of the per-rank copy roofline at 64 MiB. In `cuda`
// (one GPU per rank) each rank sends (world - 1) / world of B over its links and algbw can reach world / (world - 1)
// of the per-rank link bandwidth.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;          // words per lane per unit: 2 KiB per warp in flight with 16-byte words
constexpr int kBlocksPerSm = 8;     // 64 warps per SM: about 128 KiB of loads in flight

template <int B> struct Word;
template <> struct Word<16> { using type = uint4; };
template <> struct Word<8> { using type = uint2; };
template <> struct Word<4> { using type = unsigned int; };
template <> struct Word<2> { using type = unsigned short; };
template <> struct Word<1> { using type = unsigned char; };

struct Args {
  const char* table;        // own shard [V_r, d] (NULL when empty)
  const int64_t* ids;       // [T]
  const int64_t* bounds;    // [world + 1]
  char* dst[CB_MAX_RANKS];  // every rank's out [T, d], starting with rank + 1: dst[j] = out of (rank + 1 + j) % world
  char* own;                // this rank's out
  int64_t tokens, row_bytes;
  int world, rank;
};

template <int W>
__global__ void __launch_bounds__(kThreads) embedding_kernel(const Args a) {
  using Wd = typename Word<W>::type;
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * kThreads) >> 5;
  const int64_t lo = __ldg(a.bounds + a.rank), hi = __ldg(a.bounds + a.rank + 1);
  const int64_t nwords = a.row_bytes / W;
  constexpr int64_t kChunkWords = 32 * kUnroll;
  const int64_t upt = (nwords + kChunkWords - 1) / kChunkWords;  // units per token
  const int64_t units = a.tokens * upt;
  for (int64_t u = warp; u < units; u += warps) {
    const int64_t i = u / upt;
    const int64_t w0 = (u - i * upt) * kChunkWords + lane;
    const int64_t id = __ldg(a.ids + i);  // warp-uniform: every branch below is taken by the whole warp
    if (id >= lo && id < hi) {
      const Wd* src = reinterpret_cast<const Wd*>(a.table + (id - lo) * a.row_bytes);
      Wd v[kUnroll];
#pragma unroll
      for (int q = 0; q < kUnroll; ++q)
        if (w0 + q * 32 < nwords) v[q] = __ldg(src + w0 + q * 32);
#pragma unroll
      for (int j = 0; j < CB_MAX_RANKS; ++j)  // unrolled: the kernel parameter is indexed statically
        if (j < a.world) {
          Wd* dst = reinterpret_cast<Wd*>(a.dst[j] + i * a.row_bytes);
#pragma unroll
          for (int q = 0; q < kUnroll; ++q)
            if (w0 + q * 32 < nwords) dst[w0 + q * 32] = v[q];
        }
    } else if (id < 0) {  // padding: a zero row, which every rank writes into its own out
      Wd* dst = reinterpret_cast<Wd*>(a.own + i * a.row_bytes);
      const Wd zero{};
#pragma unroll
      for (int q = 0; q < kUnroll; ++q)
        if (w0 + q * 32 < nwords) dst[w0 + q * 32] = zero;
    }
  }
}

template <int W>
void launch(const Args& a, int64_t grid, cudaStream_t stream) {
  embedding_kernel<W><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(a);
}

// Ranks that share this rank's GPU: the judge puts either every rank on one GPU (cuda-shared) or one rank on
// each GPU (cuda), so the right neighbour tells which.
int ranks_per_gpu(const cb_args* a) {
  if (a->world < 2) return 1;
  cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, a->peer_out[(a->rank + 1) % a->world]) != cudaSuccess) {
    (void)cudaGetLastError();
    return a->world;
  }
  return at.device == a->device ? a->world : 1;
}

int64_t dtype_bytes(int dtype) {
  switch (dtype) {
    case CB_FLOAT32: return 4;
    case CB_FLOAT16: case CB_BFLOAT16: return 2;
    default: return 0;
  }
}

}  // namespace

CB_ENTRY vocab_embedding(const cb_args* args, cudaStream_t stream) {
  const int world = args->world;
  const int64_t esz = dtype_bytes(args->dtype);
  if (esz == 0 || world < 1 || world > CB_MAX_RANKS) return 1;
  const int64_t tokens = args->aux_in_count[0];
  if (tokens < 1 || args->aux_in_count[1] != world + 1 || args->out_count % tokens != 0) return 4;
  const int64_t d = args->out_count / tokens;
  if (d < 1 || args->count % d != 0) return 4;

  Args a{};
  a.table = static_cast<const char*>(args->in);
  a.ids = static_cast<const int64_t*>(args->aux_in[0]);
  a.bounds = static_cast<const int64_t*>(args->aux_in[1]);
  a.tokens = tokens;
  a.row_bytes = d * esz;
  a.world = world;
  a.rank = args->rank;
  a.own = static_cast<char*>(args->out);
  uintptr_t bits = static_cast<uintptr_t>(a.row_bytes) | reinterpret_cast<uintptr_t>(args->in);
  for (int j = 0; j < world; ++j) {
    a.dst[j] = static_cast<char*>(args->peer_out[(args->rank + 1 + j) % world]);
    bits |= reinterpret_cast<uintptr_t>(a.dst[j]);
  }

  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  int64_t grid = static_cast<int64_t>(sms) * kBlocksPerSm / ranks_per_gpu(args);
  // no more warps than units (a unit is at most 2 KiB of a row)
  const int64_t word = (bits & 15) == 0 ? 16 : (bits & 7) == 0 ? 8 : (bits & 3) == 0 ? 4 : (bits & 1) == 0 ? 2 : 1;
  const int64_t upt = (a.row_bytes / word + 32 * kUnroll - 1) / (32 * kUnroll);
  const int64_t need = (tokens * upt + kThreads / 32 - 1) / (kThreads / 32);
  if (grid > need) grid = need;
  if (grid < 1) grid = 1;

  switch (word) {
    case 16: launch<16>(a, grid, stream); break;
    case 8: launch<8>(a, grid, stream); break;
    case 4: launch<4>(a, grid, stream); break;
    case 2: launch<2>(a, grid, stream); break;
    default: launch<1>(a, grid, stream); break;
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
