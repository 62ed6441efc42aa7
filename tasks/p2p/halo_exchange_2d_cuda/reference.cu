// Reference: 2-D halo exchange with corners over peer memory, in one kernel per rank, by pulling.
//
// Rank (i, j) of the P x Q grid writes its own y [H + 2h, W + 2h] and nothing else: every cell of y is a copy of
// a cell of one of the nine tiles around it (its own included) or the fill value, so the rank loads straight from
// its neighbours' x (args->peer_in) and stores into its own y. No flags: every x is complete before any call
// starts, and nothing reads a y before every rank's work has finished.
//
// y is split into 16-byte words by flat byte offset o (y is 256-byte aligned, so every word is an aligned uint4
// store). Row a = o / RB (RB = (W + 2h) esz) and byte c of it say where the word comes from: the row band
// (a < h: the tile above, its row H - h + a; a < h + H: the own row a - h; else the tile below) and the column
// band (c < h esz: the tile to the left, from its column W - h; c < (h + W) esz: the middle; else the right), so
// the nine neighbour pointers, NULL where the neighbour lies outside an open domain, are resolved on the host. A
// word inside one band is one run of 16 bytes of one source row, loaded with the widest accesses its address
// allows (one 16-byte load, two of 8, four of 4, or five aligned 4-byte loads joined with funnel shifts) or made
// of the fill pattern; words that straddle a band or a row of y (at most three per row of y) and the last, partial
// word go byte by byte. Each thread has kWords words in flight (all loads, then all stores) in a grid-stride loop
// over a grid that covers the GPU; index arithmetic is 32-bit where y's size allows.
//
// Traffic: every byte of y is written once and read once from a tile (the fill from nowhere); a copy's traffic
// for all of y. The benchmark counts only the frame: a periodic square tile of side 4h, whose y also holds the
// 16 h^2 interior cells beside the 20 h^2 of the frame, so busbw reaches at most 20 / 36 of the copy roofline
// (the card's roofline_bound). Its rows are 16-byte aligned (h a multiple of 4 in float32), so every word but
// the band-straddling ones takes the single 16-byte load; the target is 70 % or more of that bound at 64 MiB in
// cuda-shared (strided_pack_put's kernel, with the same structure, reaches 68-79 % of the copy roofline there).
#include "commbench.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

namespace {

constexpr int kThreads = 256;
constexpr int kWords = 4;        // 16-byte words per thread in flight
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

// The bytes of one element of value `v` (a small integer, exactly representable in every type).
uint64_t fill_bits(int dtype, int64_t v) {
  switch (dtype) {
    case CB_FLOAT64: { double d = static_cast<double>(v); uint64_t b; memcpy(&b, &d, 8); return b; }
    case CB_FLOAT32: { float f = static_cast<float>(v); uint32_t b; memcpy(&b, &f, 4); return b; }
    case CB_BFLOAT16: { float f = static_cast<float>(v); uint32_t b; memcpy(&b, &f, 4); return b >> 16; }  // exact
    case CB_FLOAT16: { __half_raw r = __half(__float2half(static_cast<float>(v))); return r.x; }
    case CB_INT64: return static_cast<uint64_t>(v);
    case CB_INT32: return static_cast<uint32_t>(static_cast<int32_t>(v));
    default: return static_cast<uint8_t>(v);
  }
}

struct Args {
  const unsigned char* src[9];  // tile of neighbour (di, dj) at [(di + 1) * 3 + dj + 1]; NULL: outside (fill)
  unsigned char* out;
  uint4 fill16;                 // the fill pattern of one 16-byte word (every word starts at an element)
  uint64_t fill;                // one element's bytes
  int64_t tile_bytes;           // H W esz
  int64_t out_bytes;            // (H + 2h) RB
  int64_t rb;                   // (W + 2h) esz: a row of y
  int64_t wb;                   // W esz: a row of a tile
  int64_t hb;                   // h esz
  int64_t rows, halo;           // H, h
  int esz;
};

// Where byte o of y comes from: neighbour slot nb, byte s of that tile, and the bytes left in its band's run.
template <typename I>
__device__ __forceinline__ void locate(const Args& a, I o, int& nb, I& s, I& left) {
  const I rb = static_cast<I>(a.rb), wb = static_cast<I>(a.wb), hb = static_cast<I>(a.hb);
  const I H = static_cast<I>(a.rows), h = static_cast<I>(a.halo);
  const I row = o / rb;
  const I c = o - row * rb;
  int di;
  I sr;
  if (row < h) { di = 0; sr = H - h + row; }
  else if (row < h + H) { di = 1; sr = row - h; }
  else { di = 2; sr = row - h - H; }
  int dj;
  I sc;
  if (c < hb) { dj = 0; sc = wb - hb + c; left = hb - c; }
  else if (c < hb + wb) { dj = 1; sc = c - hb; left = hb + wb - c; }
  else { dj = 2; sc = c - hb - wb; left = rb - c; }
  nb = di * 3 + dj;
  s = sr * wb + sc;
}

__device__ __forceinline__ uint32_t ld32(const unsigned char* p) { return *reinterpret_cast<const uint32_t*>(p); }

// The 16 bytes at byte s of a tile (s + 16 <= tile_bytes).
__device__ __forceinline__ uint4 load16(const unsigned char* t, int64_t s, int64_t tile_bytes) {
  const unsigned char* p = t + s;
  const unsigned mis = static_cast<unsigned>(s & 15);
  if (mis == 0) return *reinterpret_cast<const uint4*>(p);
  if ((mis & 7) == 0) {
    const uint2 lo = *reinterpret_cast<const uint2*>(p);
    const uint2 hi = *reinterpret_cast<const uint2*>(p + 8);
    return make_uint4(lo.x, lo.y, hi.x, hi.y);
  }
  if ((mis & 3) == 0) return make_uint4(ld32(p), ld32(p + 4), ld32(p + 8), ld32(p + 12));
  const int64_t base = s - (mis & 3);  // 4-byte aligned; its fifth word ends at most 3 bytes past s + 16
  if (base + 20 <= tile_bytes) {
    const unsigned shift = 8 * (mis & 3);
    const unsigned char* q = t + base;
    const uint32_t w0 = ld32(q), w1 = ld32(q + 4), w2 = ld32(q + 8), w3 = ld32(q + 12), w4 = ld32(q + 16);
    return make_uint4(__funnelshift_r(w0, w1, shift), __funnelshift_r(w1, w2, shift), __funnelshift_r(w2, w3, shift),
                      __funnelshift_r(w3, w4, shift));
  }
  uint32_t w[4] = {0u, 0u, 0u, 0u};  // at the very end of the tile: byte by byte, never past it
  for (int b = 0; b < 16; ++b) w[b >> 2] |= static_cast<uint32_t>(p[b]) << (8 * (b & 3));
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Word at byte o of y (o a multiple of 16); bytes past the end of y are zero (never stored).
template <typename I>
__device__ __forceinline__ uint4 word_at(const Args& a, I o) {
  int nb;
  I s, left;
  locate<I>(a, o, nb, s, left);
  if (left >= 16 && static_cast<int64_t>(o) + 16 <= a.out_bytes) {
    const unsigned char* t = a.src[nb];
    return t == nullptr ? a.fill16 : load16(t, static_cast<int64_t>(s), a.tile_bytes);
  }
  uint32_t w[4] = {0u, 0u, 0u, 0u};  // straddles a band or a row, or the partial last word
  for (int b = 0; b < 16 && static_cast<int64_t>(o) + b < a.out_bytes; ++b) {
    locate<I>(a, static_cast<I>(o + b), nb, s, left);
    const unsigned char* t = a.src[nb];
    const uint32_t v = t == nullptr ? static_cast<uint32_t>(a.fill >> (8 * (static_cast<int64_t>(s) % a.esz))) & 0xffu
                                    : static_cast<uint32_t>(t[s]);
    w[b >> 2] |= v << (8 * (b & 3));
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// I: uint32_t when every byte offset of y (plus a word) fits, else uint64_t.
template <typename I>
__global__ void __launch_bounds__(kThreads) halo_kernel(const __grid_constant__ Args a) {
  const I nwords = static_cast<I>((a.out_bytes + 15) / 16);
  const I stride = static_cast<I>(gridDim.x) * kThreads;
  for (I base = static_cast<I>(blockIdx.x) * kThreads + threadIdx.x; base < nwords; base += kWords * stride) {
    uint4 v[kWords];
#pragma unroll
    for (int u = 0; u < kWords; ++u) {
      const I w = base + u * stride;
      if (w < nwords) v[u] = word_at<I>(a, w * 16);
    }
#pragma unroll
    for (int u = 0; u < kWords; ++u) {
      const I w = base + u * stride;
      if (w >= nwords) continue;
      const int64_t o = static_cast<int64_t>(w) * 16;
      if (o + 16 <= a.out_bytes) {
        *reinterpret_cast<uint4*>(a.out + o) = v[u];
      } else {  // the partial last word: only the bytes that exist
        const uint32_t parts[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
        for (int b = 0; o + b < a.out_bytes; ++b) a.out[o + b] = static_cast<unsigned char>(parts[b >> 2] >> (8 * (b & 3)));
      }
    }
  }
}

}  // namespace

CB_ENTRY halo_exchange_2d(const cb_args* args, cudaStream_t stream) {
  const int64_t esz = dtype_bytes(args->dtype);
  const int world = args->world, rank = args->rank;
  const int64_t h = args->params[0], q = args->params[1], W = args->params[4];
  const bool periodic = args->params[2] != 0;
  if (esz == 0 || world < 1 || world > CB_MAX_RANKS || q < 1 || world % q != 0 || h < 0 || W < 1) return 1;
  if (args->count % W != 0) return 4;
  const int64_t p = world / q, H = args->count / W;
  if (h > H || h > W || args->out_count != (H + 2 * h) * (W + 2 * h)) return 4;
  const int64_t i = rank / q, j = rank % q;

  Args k{};
  for (int di = -1; di <= 1; ++di)
    for (int dj = -1; dj <= 1; ++dj) {
      int64_t ni = i + di, nj = j + dj;
      if (periodic) {
        ni = (ni + p) % p;
        nj = (nj + q) % q;
      }
      const bool inside = ni >= 0 && ni < p && nj >= 0 && nj < q;
      k.src[(di + 1) * 3 + dj + 1] = inside ? static_cast<const unsigned char*>(args->peer_in[ni * q + nj]) : nullptr;
      if (inside && k.src[(di + 1) * 3 + dj + 1] == nullptr) return 1;
    }
  k.out = static_cast<unsigned char*>(args->out);
  k.fill = fill_bits(args->dtype, args->params[3]);
  uint32_t f[4] = {0u, 0u, 0u, 0u};
  for (int b = 0; b < 16; ++b) f[b >> 2] |= static_cast<uint32_t>((k.fill >> (8 * (b % esz))) & 0xffu) << (8 * (b & 3));
  k.fill16 = make_uint4(f[0], f[1], f[2], f[3]);
  k.tile_bytes = H * W * esz;
  k.rb = (W + 2 * h) * esz;
  k.out_bytes = (H + 2 * h) * k.rb;
  k.wb = W * esz;
  k.hb = h * esz;
  k.rows = H;
  k.halo = h;
  k.esz = static_cast<int>(esz);

  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  const int64_t nwords = (k.out_bytes + 15) / 16;
  int64_t grid = (nwords + static_cast<int64_t>(kThreads) * kWords - 1) / (static_cast<int64_t>(kThreads) * kWords);
  if (grid > static_cast<int64_t>(sms) * kBlocksPerSm) grid = static_cast<int64_t>(sms) * kBlocksPerSm;
  if (grid < 1) grid = 1;
  if (k.out_bytes + 16 <= static_cast<int64_t>(UINT32_MAX))
    halo_kernel<uint32_t><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(k);
  else
    halo_kernel<uint64_t><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(k);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
