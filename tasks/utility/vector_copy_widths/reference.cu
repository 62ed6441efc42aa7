// Reference: a copy whose two ends sit at unrelated byte offsets, with 16-byte accesses whatever the offsets.
//
// The destination decides the layout: a head of fewer than 16 bytes brings it to a 16-byte boundary, then nb
// aligned 16-byte words, then a tail of fewer than 16 bytes (head and tail are stored byte by byte). The source
// bytes of destination word k start at src + head + 16 k, at the same offset sh = (src + head) mod 16 inside an
// aligned source word for every k:
//   sh == 0: plain 16-byte loads and stores;
//   sh != 0: destination word k is bytes sh .. sh + 15 of the aligned source words S[k], S[k + 1]. Lane L of a warp
//            loads S[k] for k = c + L (one coalesced 16-byte load per lane), gets S[k + 1] from lane L + 1 with a
//            shuffle (lane 31 loads that one word itself), and assembles its word with four funnel shifts
//            (__funnelshift_r takes 4 bytes out of two neighbouring 32-bit words). Every source word loaded holds
//            at least one byte of the window, so no load leaves the input's allocation.
// Each thread keeps kUnroll loads in flight before its stores; the grid covers the GPU (up to 4 blocks of 256
// threads per SM) and strides over the words in warp-sized chunks, so the loop trip count is warp-uniform and the
// shuffles always see a full warp.
//
// Bound: a copy of B bytes reads B and writes B; the judge's roofline is the device's copy bandwidth (shared by the
// ranks in cuda-shared), which this kernel should reach to about 90 % at 64 MiB for every relative alignment: the
// shifts cost a few integer instructions per 16 bytes, far below what the memory system takes to move them.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // 16-byte words in flight per thread
constexpr int kBlocksPerSm = 4;
constexpr unsigned kFull = 0xffffffffu;

int64_t dtype_bytes(int dtype) {
  switch (dtype) {
    case CB_FLOAT64: case CB_INT64: return 8;
    case CB_FLOAT32: case CB_INT32: return 4;
    case CB_FLOAT16: case CB_BFLOAT16: return 2;
    case CB_UINT8: return 1;
    default: return 0;
  }
}

// Bytes sh .. sh + 15 of the 32 bytes (a, b), sh = 4 Q + bits / 8: little-endian, so byte j of the pair is byte
// j % 4 of 32-bit word j / 4, and __funnelshift_r(lo, hi, s) is the low word of (hi:lo) >> s.
template <int Q>
__device__ __forceinline__ uint4 realign(const uint4& a, const uint4& b, uint32_t bits) {
  const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  uint4 r;
  r.x = __funnelshift_r(w[Q + 0], w[Q + 1], bits);
  r.y = __funnelshift_r(w[Q + 1], w[Q + 2], bits);
  r.z = __funnelshift_r(w[Q + 2], w[Q + 3], bits);
  r.w = __funnelshift_r(w[Q + 3], w[Q + 4], bits);
  return r;
}

__device__ __forceinline__ uint4 shfl_down1(const uint4& v) {
  uint4 r;
  r.x = __shfl_down_sync(kFull, v.x, 1);
  r.y = __shfl_down_sync(kFull, v.y, 1);
  r.z = __shfl_down_sync(kFull, v.z, 1);
  r.w = __shfl_down_sync(kFull, v.w, 1);
  return r;
}

// Q < 0: source words aligned like the destination's (sh == 0); else sh = 4 Q + bits / 8.
// dst: nb aligned words; src: the aligned source word holding the first body byte (nb + 1 words when Q >= 0).
// edge_dst / edge_src: the whole window (nbytes), of which bytes [0, head) and [tail, nbytes) are the edges.
template <int Q>
__global__ void __launch_bounds__(kThreads) copy_kernel(uint4* __restrict__ dst, const uint4* __restrict__ src,
                                                        int64_t nb, uint32_t bits, unsigned char* __restrict__ edge_dst,
                                                        const unsigned char* __restrict__ edge_src, int64_t head,
                                                        int64_t tail, int64_t nbytes) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * kThreads) >> 5;
  constexpr int64_t kChunk = 32 * kUnroll;  // words per warp and step
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);

  for (int64_t c = warp * kChunk; c < nb; c += nwarps * kChunk) {  // c is the same on every lane of the warp
    uint4 a[kUnroll];
    if constexpr (Q < 0) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t k = c + u * 32 + lane;
        a[u] = k < nb ? __ldcs(src + k) : zero;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t k = c + u * 32 + lane;
        if (k < nb) __stcs(dst + k, a[u]);
      }
    } else {
      uint4 e[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t k = c + u * 32 + lane;
        a[u] = k <= nb ? __ldcs(src + k) : zero;                   // S[nb] holds the window's last bytes
        e[u] = (lane == 31 && k < nb) ? __ldcs(src + k + 1) : zero;  // the word right of the warp's last
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t k = c + u * 32 + lane;
        uint4 b = shfl_down1(a[u]);  // S[k + 1] from the next lane (every lane takes part)
        if (lane == 31) b = e[u];
        if (k < nb) __stcs(dst + k, realign<Q>(a[u], b, bits));
      }
    }
  }

  // the edges: fewer than 16 bytes before the first aligned destination word and after the last
  if (blockIdx.x == 0 && threadIdx.x < 32) {
    const int64_t j = threadIdx.x < 16 ? threadIdx.x : tail + (threadIdx.x - 16);
    if ((threadIdx.x < 16 && j < head) || (threadIdx.x >= 16 && j < nbytes)) edge_dst[j] = edge_src[j];
  }
}

}  // namespace

CB_ENTRY offset_copy(const cb_args* args, cudaStream_t stream) {
  const int64_t esz = dtype_bytes(args->dtype);
  if (esz == 0) return 1;
  const int64_t a = args->params[0], b = args->params[1], n = args->params[2];
  if (a < 0 || b < 0 || n < 0 || a + n > args->count || b + n > args->out_count) return 4;
  if (n == 0) return 0;
  const unsigned char* src = static_cast<const unsigned char*>(args->in) + a * esz;
  unsigned char* dst = static_cast<unsigned char*>(args->out) + b * esz;
  const int64_t nbytes = n * esz;

  int64_t head = static_cast<int64_t>((0 - reinterpret_cast<uintptr_t>(dst)) & 15u);
  if (head > nbytes) head = nbytes;
  const int64_t nb = (nbytes - head) / 16;
  const int64_t tail = head + nb * 16;
  const int sh = static_cast<int>(reinterpret_cast<uintptr_t>(src + head) & 15u);
  uint4* dst_words = reinterpret_cast<uint4*>(dst + head);
  const uint4* src_words = reinterpret_cast<const uint4*>(src + head - sh);
  const uint32_t bits = 8u * static_cast<uint32_t>(sh & 3);

  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  const int64_t per_block = static_cast<int64_t>(kThreads) * kUnroll;  // words per block and step
  int64_t grid = (nb + per_block - 1) / per_block;
  if (grid > static_cast<int64_t>(kBlocksPerSm) * sms) grid = static_cast<int64_t>(kBlocksPerSm) * sms;
  if (grid < 1) grid = 1;
  const dim3 g(static_cast<unsigned>(grid)), t(kThreads);
  if (sh == 0) {
    copy_kernel<-1><<<g, t, 0, stream>>>(dst_words, src_words, nb, bits, dst, src, head, tail, nbytes);
  } else {
    switch (sh >> 2) {
      case 0: copy_kernel<0><<<g, t, 0, stream>>>(dst_words, src_words, nb, bits, dst, src, head, tail, nbytes); break;
      case 1: copy_kernel<1><<<g, t, 0, stream>>>(dst_words, src_words, nb, bits, dst, src, head, tail, nbytes); break;
      case 2: copy_kernel<2><<<g, t, 0, stream>>>(dst_words, src_words, nb, bits, dst, src, head, tail, nbytes); break;
      default: copy_kernel<3><<<g, t, 0, stream>>>(dst_words, src_words, nb, bits, dst, src, head, tail, nbytes); break;
    }
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
