// Reference: indexed row gather from a table sharded over the ranks, by pulling each row from its owner.
//
// Rank s returns y[m] = global row ids[m] (-1: a zero row). Global row g lives on rank g / R at its row g % R, so
// every row is one contiguous run of d * esz bytes in some rank's x (args->peer_in), copied to row m of the own y.
// Rows are independent: no flags, no ordering between ranks (every x is complete before any call starts, and a
// rank writes only its own y). Duplicate ids are simply fetched again (they hit the L2 when close in time).
//
// Work is split into units of (row, chunk): a group of g lanes (g = 32, or the power of two that covers a short
// row, so that a warp serves 32 / g short rows at once) copies chunk c of row m, kUnroll words of the widest
// width B that divides the row size (x and y are 256-byte aligned, so every row of both starts B-aligned), all
// loads first, then all stores: 2 KiB in flight per warp with 16-byte words. The id is loaded once per unit
// (a broadcast within the group) and the owner found with one 64-bit division per unit, never per word. The grid
// covers the GPU (nothing waits) and walks the units with a grid stride.
//
// Bound: y's bytes are read once (from whichever rank owns them) and written once: a copy. The target is 80 % or
// more of the copy roofline at 64 MiB in cuda-shared (the benchmark's rows are 8 KiB of bfloat16, read at random:
// whole DRAM pages, so random order costs little).
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;       // words per lane in flight
constexpr int kBlocksPerSm = 8;  // nothing waits: the grid only needs to cover the GPU

int64_t dtype_bytes(int dtype) {
  switch (dtype) {
    case CB_FLOAT64: case CB_INT64: return 8;
    case CB_FLOAT32: case CB_INT32: return 4;
    case CB_FLOAT16: case CB_BFLOAT16: return 2;
    case CB_UINT8: return 1;
    default: return 0;
  }
}

template <int B> struct Word;
template <> struct Word<16> { using type = uint4; };
template <> struct Word<8> { using type = uint2; };
template <> struct Word<4> { using type = uint32_t; };
template <> struct Word<2> { using type = uint16_t; };
template <> struct Word<1> { using type = uint8_t; };

struct Args {
  const unsigned char* shard[CB_MAX_RANKS];  // every rank's x
  const int64_t* ids;                        // own ids [M]
  unsigned char* out;                        // own y [M, d]
  int64_t rows;                              // R: rows per shard
  int64_t total;                             // world * R
  int64_t lookups;                           // M
  int64_t row_bytes;                         // d * esz
  int64_t wpr;                               // words per row
  int64_t upr;                               // units (chunks) per row
  int g_log2;                                // lanes per row group: 1 << g_log2 (1 .. 32)
};

template <int B>
__global__ void __launch_bounds__(kThreads) gather_kernel(const __grid_constant__ Args a) {
  using Wd = typename Word<B>::type;
  const int lane = threadIdx.x & 31;
  const int g = 1 << a.g_log2;
  const int sub = lane >> a.g_log2, gl = lane & (g - 1);
  const int gpw = 32 >> a.g_log2;  // groups per warp
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * kThreads) >> 5;
  const int64_t units = a.lookups * a.upr;
  const int64_t chunk = static_cast<int64_t>(g) * kUnroll;  // words per unit
  for (int64_t u = warp * gpw + sub; u < units; u += nwarps * gpw) {
    const int64_t m = a.upr == 1 ? u : u / a.upr;
    const int64_t c0 = (u - m * a.upr) * chunk + gl;
    const int64_t id = __ldg(a.ids + m);
    Wd* dst = reinterpret_cast<Wd*>(a.out + m * a.row_bytes);
    if (id < 0 || id >= a.total) {  // -1: a zero row (nothing else is outside the table)
      const Wd zero{};
#pragma unroll
      for (int q = 0; q < kUnroll; ++q)
        if (c0 + q * g < a.wpr) dst[c0 + q * g] = zero;
      continue;
    }
    const int64_t owner = id / a.rows;
    const Wd* src = reinterpret_cast<const Wd*>(a.shard[owner] + (id - owner * a.rows) * a.row_bytes);
    Wd v[kUnroll];
#pragma unroll
    for (int q = 0; q < kUnroll; ++q)
      if (c0 + q * g < a.wpr) v[q] = src[c0 + q * g];
#pragma unroll
    for (int q = 0; q < kUnroll; ++q)
      if (c0 + q * g < a.wpr) dst[c0 + q * g] = v[q];
  }
}

template <int B>
int launch(const Args& a, int sms, cudaStream_t stream) {
  const int64_t units = a.lookups * a.upr;
  const int64_t groups_per_block = (kThreads / 32) * (32 >> a.g_log2);
  int64_t grid = (units + groups_per_block - 1) / groups_per_block;
  if (grid > static_cast<int64_t>(sms) * kBlocksPerSm) grid = static_cast<int64_t>(sms) * kBlocksPerSm;
  if (grid < 1) grid = 1;
  gather_kernel<B><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(a);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}

}  // namespace

CB_ENTRY gather_rows(const cb_args* args, cudaStream_t stream) {
  const int64_t esz = dtype_bytes(args->dtype);
  const int world = args->world;
  if (esz == 0 || world < 1 || world > CB_MAX_RANKS) return 1;
  const int64_t m = args->aux_in_count[0];
  if (m < 1 || args->out_count % m != 0) return 4;
  const int64_t d = args->out_count / m;
  if (d < 1 || args->count % d != 0 || args->count / d < 1) return 4;

  Args a{};
  for (int p = 0; p < world; ++p) {
    a.shard[p] = static_cast<const unsigned char*>(args->peer_in[p]);
    if (a.shard[p] == nullptr) return 1;
  }
  a.ids = static_cast<const int64_t*>(args->aux_in[0]);
  a.out = static_cast<unsigned char*>(args->out);
  a.rows = args->count / d;
  a.total = a.rows * world;
  a.lookups = m;
  a.row_bytes = d * esz;
  const int b = (a.row_bytes & 15) == 0 ? 16 : (a.row_bytes & 7) == 0 ? 8 : (a.row_bytes & 3) == 0 ? 4
              : (a.row_bytes & 1) == 0 ? 2 : 1;
  a.wpr = a.row_bytes / b;
  int g_log2 = 0;
  while ((1 << g_log2) < 32 && (1 << g_log2) < a.wpr) ++g_log2;
  a.g_log2 = g_log2;
  const int64_t chunk = static_cast<int64_t>(1 << g_log2) * kUnroll;
  a.upr = (a.wpr + chunk - 1) / chunk;

  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  switch (b) {
    case 16: return launch<16>(a, sms, stream);
    case 8: return launch<8>(a, sms, stream);
    case 4: return launch<4>(a, sms, stream);
    case 2: return launch<2>(a, sms, stream);
    default: return launch<1>(a, sms, stream);
  }
}
