// Reference: expert weight migration to a new placement, each rank PULLING the experts of its new slots from
// their old owners' weights (args->peer_in[p]), all sources at once, in ONE kernel per rank.
//
// Grid (gx, k): blockIdx.y is the new slot j of this rank, blockIdx.x a chunk of that slot's expert. Every block
// first finds where its expert was: e = new_placement[rank][j], then the one q with old_placement[q] == e (the
// placement is a permutation; the block's threads scan the E = world * k entries in parallel, a few loads each
// from L2), so q / k is the old owner and q % k its old slot. No rank waits for another: every input is complete
// before the call and each rank writes only its own output, so no flags are needed and nothing can deadlock.
// Experts that stay on the rank are read from its own weights (peer_in[rank] == in) by the same code.
//
// The copy is bandwidth-bound: each thread keeps kUnroll 16-byte loads in flight (load all, then store all),
// loads streamed (__ldcs: read once) and stores streamed (__stcs), the chunk of a block is 512 threads x 4 words
// = 32 KiB, and the grid has k * ceil(expert words / chunk) blocks, so the whole GPU is covered whatever the
// number and size of experts (a grid-stride loop takes over past 65535 chunks per expert). Words are 16 bytes
// where the expert's size and every rank's buffers allow, else 8, 4, 2 or 1 byte(s).
//
// Roofline: the algbw metric counts one rank's weights (X bytes) per call; every rank reads X and writes X, so in
// cuda-shared the ranks together make world copies of X on one GPU, and each rank's share of the device copy
// bandwidth is the roofline (per rank = copy / world). Expected on one H200: about 85-90 % of it at 64 MiB (a
// streaming copy with 32 KiB in flight per block and several blocks per SM); with one GPU per rank the pulls
// cross NVLink and the expected share is similar, since (world - 1) / world of the experts move in the benchmark.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;
constexpr int64_t kMaxGridX = 65535;

template <int B> struct Word;
template <> struct Word<16> { using type = uint4; };
template <> struct Word<8> { using type = uint2; };
template <> struct Word<4> { using type = unsigned int; };
template <> struct Word<2> { using type = unsigned short; };
template <> struct Word<1> { using type = unsigned char; };

struct MigrateArgs {
  const char* in[CB_MAX_RANKS];  // every rank's weights [k, n]
  const int64_t* old_placement;  // [world, k]
  const int64_t* new_placement;  // [world, k]
  char* out;                     // this rank's new weights [k, n]
  int64_t expert_bytes;
  int k, world, rank;
};

template <int B>
__global__ void __launch_bounds__(kThreads) migrate_kernel(const __grid_constant__ MigrateArgs a) {
  using Wd = typename Word<B>::type;
  __shared__ int s_src;
  const int j = blockIdx.y;
  const int experts = a.world * a.k;
  if (threadIdx.x == 0) s_src = -1;
  __syncthreads();
  const int64_t e = __ldg(a.new_placement + static_cast<int64_t>(a.rank) * a.k + j);
  for (int q = threadIdx.x; q < experts; q += kThreads)
    if (__ldg(a.old_placement + q) == e) s_src = q;  // exactly one q matches
  __syncthreads();
  const int src = s_src;
  if (src < 0) return;  // never for valid placements
  const int p = src / a.k, slot = src - p * a.k;
  const Wd* from = reinterpret_cast<const Wd*>(a.in[p] + static_cast<int64_t>(slot) * a.expert_bytes);
  Wd* to = reinterpret_cast<Wd*>(a.out + static_cast<int64_t>(j) * a.expert_bytes);
  const int64_t nw = a.expert_bytes / B;
  const int64_t chunk = static_cast<int64_t>(kThreads) * kUnroll;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * chunk + threadIdx.x; base < nw;
       base += static_cast<int64_t>(gridDim.x) * chunk) {
    Wd v[kUnroll];
#pragma unroll
    for (int i = 0; i < kUnroll; ++i)
      if (base + i * kThreads < nw) v[i] = __ldcs(from + base + i * kThreads);
#pragma unroll
    for (int i = 0; i < kUnroll; ++i)
      if (base + i * kThreads < nw) __stcs(to + base + i * kThreads, v[i]);
  }
}

template <int B>
void launch(const MigrateArgs& a, int64_t nw, cudaStream_t stream) {
  const int64_t chunk = static_cast<int64_t>(kThreads) * kUnroll;
  int64_t gx = (nw + chunk - 1) / chunk;
  if (gx > kMaxGridX) gx = kMaxGridX;
  if (gx < 1) gx = 1;
  migrate_kernel<B><<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(a.k)), kThreads, 0, stream>>>(a);
}

int64_t dtype_bytes(int dtype) {
  switch (dtype) {
    case CB_FLOAT64: case CB_INT64: return 8;
    case CB_FLOAT32: case CB_INT32: return 4;
    case CB_FLOAT16: case CB_BFLOAT16: return 2;
    case CB_UINT8: return 1;
    default: return 0;
  }
}

}  // namespace

CB_ENTRY rebalance(const cb_args* args, cudaStream_t stream) {
  const int world = args->world;
  const int64_t esz = dtype_bytes(args->dtype);
  if (esz == 0 || world < 1 || world > CB_MAX_RANKS) return 1;
  const int64_t placed = args->aux_in_count[0];  // world * k
  if (placed < world || placed % world != 0 || args->aux_in_count[1] != placed) return 4;
  const int64_t k = placed / world;
  if (k > 65535 || args->count % k != 0 || args->out_count != args->count) return 4;
  if (args->count == 0) return 0;
  const int64_t expert_bytes = args->count / k * esz;

  MigrateArgs a{};
  uintptr_t bits = static_cast<uintptr_t>(expert_bytes) | reinterpret_cast<uintptr_t>(args->out);
  for (int p = 0; p < world; ++p) {
    a.in[p] = static_cast<const char*>(args->peer_in[p]);
    bits |= reinterpret_cast<uintptr_t>(args->peer_in[p]);
  }
  a.old_placement = static_cast<const int64_t*>(args->aux_in[0]);
  a.new_placement = static_cast<const int64_t*>(args->aux_in[1]);
  a.out = static_cast<char*>(args->out);
  a.expert_bytes = expert_bytes;
  a.k = static_cast<int>(k);
  a.world = world;
  a.rank = args->rank;

  if ((bits & 15) == 0) launch<16>(a, expert_bytes / 16, stream);
  else if ((bits & 7) == 0) launch<8>(a, expert_bytes / 8, stream);
  else if ((bits & 3) == 0) launch<4>(a, expert_bytes / 4, stream);
  else if ((bits & 1) == 0) launch<2>(a, expert_bytes / 2, stream);
  else launch<1>(a, expert_bytes, stream);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
