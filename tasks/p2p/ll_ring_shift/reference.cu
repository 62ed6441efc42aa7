// Reference: ring shift with NCCL's LL (low-latency) protocol.
//
// Rank r cuts its input into 8-byte pieces (the last one zero-padded) and stores piece i into line i of the right
// neighbour's scratch as one 16-byte line {data0, flag, data1, flag}, with a single st.volatile.global.v4.u32.
// The receiver polls line i of its own scratch with ld.volatile.global.v4.u32 until both flag words hold this
// call's epoch, then writes the piece into its output. Each aligned 8-byte half {data, flag} is written and read
// whole, so a matching flag vouches for the data word next to it: no fence and no separate "done" flag, which is
// what makes LL fast for small messages (at the price of sending twice the bytes).
//
// Flags are the epoch (1, 2, 3, ... one per call, the same on every rank): scratch is zeroed once, and a line
// left from an earlier call carries an older epoch, so nothing is reset between calls. The judge synchronises
// every device between calls, so a line is never overwritten by the next call before it was read.
//
// Each thread first sends all of its lines (sends never wait), then receives the lines of the same indices; the
// receive loop issues kUnroll polls before checking any, so several remote lines are awaited at once.
// Receivers spin, so every block of every rank sharing a GPU must be resident at once: at most one block per SM
// (__launch_bounds__(512, 1)), and with all ranks on one GPU, half the SMs divided by the number of ranks.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // lines per thread in flight

int64_t dtype_bytes(int dtype) {
  switch (dtype) {
    case CB_FLOAT64: case CB_INT64: return 8;
    case CB_FLOAT32: case CB_INT32: return 4;
    case CB_FLOAT16: case CB_BFLOAT16: return 2;
    case CB_UINT8: return 1;
    default: return 0;
  }
}

__device__ __forceinline__ void st_line(uint4* p, uint32_t d0, uint32_t d1, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(d0), "r"(flag), "r"(d1), "r"(flag)
               : "memory");
}

__device__ __forceinline__ uint4 ld_line(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

struct LLArgs {
  const unsigned char* in;  // this rank's input
  unsigned char* out;       // this rank's output
  uint4* send;              // the right neighbour's scratch, as lines
  const uint4* recv;        // this rank's scratch, as lines
  int64_t nbytes;
  int64_t nlines;           // ceil(nbytes / 8)
  uint32_t epoch;
  bool wide;                // in and out are 8-byte aligned: whole pieces move as one 8-byte access
};

// Piece i of the input: 8 bytes, zero-padded past the end (little-endian, as an 8-byte load would give them).
__device__ __forceinline__ uint2 load_piece(const LLArgs& a, int64_t i) {
  const int64_t off = i * 8;
  if (a.wide && off + 8 <= a.nbytes) return *reinterpret_cast<const uint2*>(a.in + off);
  uint32_t w[2] = {0u, 0u};
  for (int j = 0; j < 8 && off + j < a.nbytes; ++j) w[j >> 2] |= static_cast<uint32_t>(a.in[off + j]) << (8 * (j & 3));
  return make_uint2(w[0], w[1]);
}

// Writes piece i into the output: only the bytes that exist.
__device__ __forceinline__ void store_piece(const LLArgs& a, int64_t i, uint32_t lo, uint32_t hi) {
  const int64_t off = i * 8;
  if (a.wide && off + 8 <= a.nbytes) {
    *reinterpret_cast<uint2*>(a.out + off) = make_uint2(lo, hi);
    return;
  }
  for (int j = 0; j < 8 && off + j < a.nbytes; ++j)
    a.out[off + j] = static_cast<unsigned char>(((j < 4 ? lo : hi) >> (8 * (j & 3))) & 0xFFu);
}

__global__ void __launch_bounds__(kThreads, 1) ll_kernel(const __grid_constant__ LLArgs a) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;

  // 1. send: lines first, first + stride, ...; all loads of a group before its stores
  for (int64_t base = first; base < a.nlines; base += kUnroll * stride) {
    uint2 d[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * stride;
      if (i < a.nlines) d[u] = load_piece(a, i);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * stride;
      if (i < a.nlines) st_line(a.send + i, d[u].x, d[u].y, a.epoch);
    }
  }

  // 2. receive the same line indices: poll a group of lines at once, then finish each
  for (int64_t base = first; base < a.nlines; base += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * stride;
      if (i < a.nlines) v[u] = ld_line(a.recv + i);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * stride;
      if (i < a.nlines) {
        while (v[u].y != a.epoch || v[u].w != a.epoch) v[u] = ld_line(a.recv + i);
        store_piece(a, i, v[u].x, v[u].z);
      }
    }
  }
}

// Ranks that share this rank's GPU. The judge puts either every rank on one GPU (cuda-shared) or one rank on
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

}  // namespace

CB_ENTRY ring_shift(const cb_args* args, cudaStream_t stream) {
  const int64_t esz = dtype_bytes(args->dtype);
  if (esz == 0) return 1;
  if (args->world < 1 || args->world > CB_MAX_RANKS) return 1;
  const int64_t nbytes = args->count * esz;
  if (nbytes <= 0) return 0;  // every rank has the same count: nobody waits
  const int right = (args->rank + 1) % args->world;
  LLArgs k{};
  k.in = static_cast<const unsigned char*>(args->in);
  k.out = static_cast<unsigned char*>(args->out);
  k.send = static_cast<uint4*>(args->peer_scratch[right]);
  k.recv = static_cast<const uint4*>(args->scratch);
  k.nbytes = nbytes;
  k.nlines = (nbytes + 7) / 8;
  k.epoch = args->epoch;
  k.wide = ((reinterpret_cast<uintptr_t>(args->in) | reinterpret_cast<uintptr_t>(args->out)) & 7) == 0;
  if (args->scratch_bytes < k.nlines * 16) return 4;  // the right neighbour's scratch is as large as ours
  if (((reinterpret_cast<uintptr_t>(k.send) | reinterpret_cast<uintptr_t>(k.recv)) & 15) != 0) return 5;

  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  int64_t grid = (k.nlines + static_cast<int64_t>(kThreads) * kUnroll - 1) / (static_cast<int64_t>(kThreads) * kUnroll);
  const int rpg = ranks_per_gpu(args);
  const int64_t resident = rpg > 1 ? sms / (2 * rpg) : sms;  // one block per SM is guaranteed resident
  if (grid > resident) grid = resident;
  if (grid < 1) grid = 1;
  ll_kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(k);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
