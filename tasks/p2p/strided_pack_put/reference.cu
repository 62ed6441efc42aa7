// Reference: pack a strided sub-matrix into the right neighbour's contiguous output, in one pass.
//
// The packed output is P = rows * cols * esz bytes, written as 16-byte words straight into the neighbour's `out`
// (256-byte aligned, so every word is an aligned 16-byte remote store; posted writes, nothing waits). Output byte o
// belongs to packed row i = o / RB (RB = cols * esz) at byte c = o - i * RB of it, which is input byte
// S0 + i * SB + c (S0 = (row0 * stride + col0) * esz, SB = stride * esz). A word that lies inside one row is read
// from the input with the widest loads its source address allows: one 16-byte load (address % 16 == 0), two of 8
// bytes, four of 4, or, for an address that is not 4-byte aligned, five aligned 4-byte loads joined with funnel
// shifts. Words that straddle two packed rows (one per row when a row holds at least 16 bytes) and the last,
// partial word go byte by byte. Each thread has kWords words in flight (all loads, then all stores), and the
// grid covers the GPU with a grid-stride loop. No flags: the judge reads an output only after every rank's work
// has finished, so the receiver need not take part.
//
// Traffic: the packed bytes are read once (plus at most a sector at each end of a row) and written once: a copy's.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kWords = 4;          // 16-byte output words per thread in flight
constexpr int kBlocksPerSm = 8;    // no waiting: the grid only needs to cover the GPU

int64_t dtype_bytes(int dtype) {
  switch (dtype) {
    case CB_FLOAT64: case CB_INT64: return 8;
    case CB_FLOAT32: case CB_INT32: return 4;
    case CB_FLOAT16: case CB_BFLOAT16: return 2;
    case CB_UINT8: return 1;
    default: return 0;
  }
}

struct Args {
  const unsigned char* in;
  unsigned char* dst;      // the right neighbour's output
  int64_t in_bytes;        // bytes of the whole input
  int64_t packed;          // P
  int64_t row_bytes;       // RB
  int64_t pitch;           // SB
  int64_t start;           // S0
};

__device__ __forceinline__ uint32_t ld_u32(const unsigned char* p) { return __ldcs(reinterpret_cast<const unsigned int*>(p)); }

// The 16 input bytes at byte offset s, as one word (s + 16 <= in_bytes).
__device__ __forceinline__ uint4 load16(const Args& a, int64_t s) {
  const unsigned char* p = a.in + s;
  const unsigned mis = static_cast<unsigned>(s & 15);
  if (mis == 0) return __ldcs(reinterpret_cast<const uint4*>(p));
  if ((mis & 7) == 0) {
    const uint2 lo = __ldcs(reinterpret_cast<const uint2*>(p));
    const uint2 hi = __ldcs(reinterpret_cast<const uint2*>(p + 8));
    return make_uint4(lo.x, lo.y, hi.x, hi.y);
  }
  if ((mis & 3) == 0) return make_uint4(ld_u32(p), ld_u32(p + 4), ld_u32(p + 8), ld_u32(p + 12));
  const unsigned shift = 8 * (mis & 3);
  const int64_t base = s - (mis & 3);  // 4-byte aligned; the fifth word ends at most 3 bytes past s + 16
  if (base + 20 <= a.in_bytes) {
    const unsigned char* q = a.in + base;
    const uint32_t w0 = ld_u32(q), w1 = ld_u32(q + 4), w2 = ld_u32(q + 8), w3 = ld_u32(q + 12), w4 = ld_u32(q + 16);
    return make_uint4(__funnelshift_r(w0, w1, shift), __funnelshift_r(w1, w2, shift), __funnelshift_r(w2, w3, shift),
                      __funnelshift_r(w3, w4, shift));
  }
  uint32_t w[4] = {0u, 0u, 0u, 0u};  // at the very end of the input: byte by byte, never past it
  for (int b = 0; b < 16; ++b) w[b >> 2] |= static_cast<uint32_t>(p[b]) << (8 * (b & 3));
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Output word at byte o, when it straddles packed rows or is the partial last word: byte by byte (zero past P).
template <typename Index>
__device__ __forceinline__ uint4 gather16(const Args& a, int64_t o) {
  uint32_t w[4] = {0u, 0u, 0u, 0u};
  const Index rb = static_cast<Index>(a.row_bytes);
  Index i = static_cast<Index>(o) / rb;
  Index c = static_cast<Index>(o) - i * rb;
  for (int b = 0; b < 16 && o + b < a.packed; ++b) {
    w[b >> 2] |= static_cast<uint32_t>(a.in[a.start + static_cast<int64_t>(i) * a.pitch + c]) << (8 * (b & 3));
    if (++c == rb) {
      c = 0;
      ++i;
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

template <typename Index>
__device__ __forceinline__ uint4 load_word(const Args& a, int64_t o) {
  const Index rb = static_cast<Index>(a.row_bytes);
  const Index i = static_cast<Index>(o) / rb;
  const Index c = static_cast<Index>(o) - i * rb;
  if (c + 16 <= rb && o + 16 <= a.packed) return load16(a, a.start + static_cast<int64_t>(i) * a.pitch + c);
  return gather16<Index>(a, o);
}

// Index: uint32_t when every packed byte offset fits (the division is then a 32-bit one), else uint64_t.
template <typename Index>
__global__ void __launch_bounds__(kThreads) strided_pack_kernel(const __grid_constant__ Args a) {
  const int64_t nwords = (a.packed + 15) / 16;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; base < nwords;
       base += kWords * stride) {
    uint4 v[kWords];
#pragma unroll
    for (int u = 0; u < kWords; ++u) {
      const int64_t w = base + u * stride;
      if (w < nwords) v[u] = load_word<Index>(a, 16 * w);
    }
#pragma unroll
    for (int u = 0; u < kWords; ++u) {
      const int64_t w = base + u * stride;
      if (w >= nwords) continue;
      const int64_t o = 16 * w;
      if (o + 16 <= a.packed) {
        *reinterpret_cast<uint4*>(a.dst + o) = v[u];
      } else {  // the partial last word: only the bytes that exist
        const uint32_t parts[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
        for (int b = 0; o + b < a.packed; ++b) a.dst[o + b] = static_cast<unsigned char>(parts[b >> 2] >> (8 * (b & 3)));
      }
    }
  }
}

}  // namespace

CB_ENTRY strided_pack(const cb_args* args, cudaStream_t stream) {
  const int64_t esz = dtype_bytes(args->dtype);
  if (esz == 0) return 1;
  if (args->world < 1 || args->world > CB_MAX_RANKS) return 1;
  const int64_t row0 = args->params[0], col0 = args->params[1], rows = args->params[2], cols = args->params[3];
  const int64_t stride = args->params[4];
  if (row0 < 0 || col0 < 0 || rows < 1 || cols < 1 || stride < col0 + cols) return 1;
  if ((row0 + rows) * stride > args->count) return 1;
  Args k{};
  k.in = static_cast<const unsigned char*>(args->in);
  k.dst = static_cast<unsigned char*>(args->peer_out[(args->rank + 1) % args->world]);
  k.in_bytes = args->count * esz;
  k.packed = rows * cols * esz;
  k.row_bytes = cols * esz;
  k.pitch = stride * esz;
  k.start = (row0 * stride + col0) * esz;
  if (k.dst == nullptr) return 1;

  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  const int64_t nwords = (k.packed + 15) / 16;
  int64_t grid = (nwords + static_cast<int64_t>(kThreads) * kWords - 1) / (static_cast<int64_t>(kThreads) * kWords);
  if (grid > static_cast<int64_t>(sms) * kBlocksPerSm) grid = static_cast<int64_t>(sms) * kBlocksPerSm;
  if (grid < 1) grid = 1;
  if (k.packed + 16 <= static_cast<int64_t>(UINT32_MAX))
    strided_pack_kernel<uint32_t><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(k);
  else
    strided_pack_kernel<uint64_t><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(k);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
