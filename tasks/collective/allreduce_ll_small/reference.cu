// Reference: latency-bound one-shot all-reduce with NCCL's LL (low-latency) protocol.
//
// Inputs and outputs are private, so every rank must send its input to every peer. Rank r cuts its input into
// 8-byte pieces (the last one zero-padded) and stores piece i into slot r, line i of every peer's scratch as one
// 16-byte line of two 8-byte words {(epoch << 32) | lo32, (epoch << 32) | hi32}, with a single
// st.volatile.global.v2.u64. Each 8-byte word is single-copy atomic, so a word whose high half holds this
// call's epoch carries the data that was stored with it: the receiver polls the lines of its own scratch with
// ld.volatile.global.v2.u64 and uses them as soon as both flag halves match. No fence, no separate flag and no
// barrier round trip: the data words are the signal. The price (2x the bytes on the wire, world - 1 copies per
// rank) does not matter at these sizes, where one NVLink round trip (~1-2 us) and the kernel launch dominate.
//
// Every rank adds the pieces of line i in rank order 0 .. world-1 (its own from its input), in float32 for the
// float types and exactly for int32, so every rank produces bit-identical sums.
//
// Flags are the epoch (1, 2, 3, ... one per call, the same on every rank): scratch is zeroed once, and a line
// left from an earlier call (or a call with another size, whose slots lie elsewhere) carries an older epoch, so
// nothing is ever reset. The judge synchronises every device between calls, so a line is never overwritten by
// the next call before it was read.
//
// Each thread first sends all of its lines to all peers (sends never wait), then receives the same line indices.
// Receivers spin, so every block of every rank sharing a GPU must be resident at once: with all ranks on one GPU
// the grid is capped at SMs / (2 * world) blocks per rank (one 512-thread block per SM always fits).
//
// Latency target (metric latency, sizes 256 B to 64 KiB): one kernel whose critical path is one remote store
// and one poll, nearly flat in size. On one H200 in cuda-shared the call is dominated by getting world kernels
// onto one GPU: expect about what collective/allreduce_oneshot measures there with public inputs (about 7 us at
// world 2 and 12 us at world 4 at 4 KiB), within a microsecond or two at 64 KiB. Across 8 H100/H200, NCCL's LL
// all-reduce is published at roughly 8-12 us for such sizes; this kernel should be at or below that.
#include "commbench.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 2;  // lines per thread in flight per group

int64_t dtype_bytes(int dtype) {
  switch (dtype) {
    case CB_FLOAT64: case CB_INT64: return 8;
    case CB_FLOAT32: case CB_INT32: return 4;
    case CB_FLOAT16: case CB_BFLOAT16: return 2;
    default: return 0;
  }
}

__device__ __forceinline__ void st_line(ulonglong2* p, uint64_t w0, uint64_t w1) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(w0), "l"(w1) : "memory");
}

__device__ __forceinline__ ulonglong2 ld_line(const ulonglong2* p) {
  ulonglong2 v;
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ bool line_ready(const ulonglong2& v, uint32_t epoch) {
  return static_cast<uint32_t>(v.x >> 32) == epoch && static_cast<uint32_t>(v.y >> 32) == epoch;
}

// The 8 payload bytes of a received line.
__device__ __forceinline__ uint64_t line_payload(const ulonglong2& v) {
  return (v.x & 0xFFFFFFFFull) | (v.y << 32);
}

// Element-wise sum of 8-byte pieces, element type T.
template <typename T> struct Adder;
template <> struct Adder<float> {
  static constexpr int N = 2;
  float acc[N];
  __device__ void set(uint64_t w) { acc[0] = __uint_as_float(static_cast<uint32_t>(w)); acc[1] = __uint_as_float(static_cast<uint32_t>(w >> 32)); }
  __device__ void add(uint64_t w) { acc[0] += __uint_as_float(static_cast<uint32_t>(w)); acc[1] += __uint_as_float(static_cast<uint32_t>(w >> 32)); }
  __device__ uint64_t get() const {
    return static_cast<uint64_t>(__float_as_uint(acc[0])) | (static_cast<uint64_t>(__float_as_uint(acc[1])) << 32);
  }
};
template <> struct Adder<int32_t> {
  static constexpr int N = 2;
  int32_t acc[N];
  __device__ void set(uint64_t w) { acc[0] = static_cast<int32_t>(static_cast<uint32_t>(w)); acc[1] = static_cast<int32_t>(static_cast<uint32_t>(w >> 32)); }
  __device__ void add(uint64_t w) { acc[0] += static_cast<int32_t>(static_cast<uint32_t>(w)); acc[1] += static_cast<int32_t>(static_cast<uint32_t>(w >> 32)); }
  __device__ uint64_t get() const {
    return static_cast<uint64_t>(static_cast<uint32_t>(acc[0])) | (static_cast<uint64_t>(static_cast<uint32_t>(acc[1])) << 32);
  }
};
// 2-byte floats: four per piece, accumulated in float32 and rounded once.
template <typename H> struct Adder16 {
  static constexpr int N = 4;
  float acc[N];
  __device__ static float lane(uint64_t w, int j) {
    const unsigned short bits = static_cast<unsigned short>((w >> (16 * j)) & 0xFFFFu);
    return to_f(bits);
  }
  __device__ static float to_f(unsigned short b) {
    if constexpr (std::is_same<H, __half>::value) return __half2float(__ushort_as_half(b));
    else return __bfloat162float(__ushort_as_bfloat16(b));
  }
  __device__ static unsigned short from_f(float v) {
    if constexpr (std::is_same<H, __half>::value) return __half_as_ushort(__float2half_rn(v));
    else return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
  __device__ void set(uint64_t w) {
#pragma unroll
    for (int j = 0; j < N; ++j) acc[j] = lane(w, j);
  }
  __device__ void add(uint64_t w) {
#pragma unroll
    for (int j = 0; j < N; ++j) acc[j] += lane(w, j);
  }
  __device__ uint64_t get() const {
    uint64_t w = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) w |= static_cast<uint64_t>(from_f(acc[j])) << (16 * j);
    return w;
  }
};
template <> struct Adder<__nv_bfloat16> : Adder16<__nv_bfloat16> {};
template <> struct Adder<__half> : Adder16<__half> {};

struct Peers { ulonglong2* scratch[CB_MAX_RANKS]; };

struct LLArgs {
  const unsigned char* in;
  unsigned char* out;
  Peers peers;        // every rank's scratch as lines (entry rank: this rank's own, which it polls)
  int64_t nbytes;
  int64_t nlines;     // ceil(nbytes / 8): one slot of nlines lines per source rank
  int rank, world;
  uint32_t epoch;
};

// Piece i of the input: 8 bytes, zero-padded past the end. in is 256-byte aligned, so whole pieces are one load.
__device__ __forceinline__ uint64_t load_piece(const LLArgs& a, int64_t i) {
  const int64_t off = i * 8;
  if (off + 8 <= a.nbytes) return *reinterpret_cast<const uint64_t*>(a.in + off);
  uint64_t w = 0;
  for (int j = 0; off + j < a.nbytes; ++j) w |= static_cast<uint64_t>(a.in[off + j]) << (8 * j);
  return w;
}

__device__ __forceinline__ void store_piece(const LLArgs& a, int64_t i, uint64_t w) {
  const int64_t off = i * 8;
  if (off + 8 <= a.nbytes) {
    *reinterpret_cast<uint64_t*>(a.out + off) = w;
    return;
  }
  for (int j = 0; off + j < a.nbytes; ++j) a.out[off + j] = static_cast<unsigned char>((w >> (8 * j)) & 0xFFu);
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) ll_allreduce_kernel(const __grid_constant__ LLArgs a) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const uint64_t tag = static_cast<uint64_t>(a.epoch) << 32;

  // 1. send: line i of slot `rank` in every peer's scratch; peers in the order rank+1, rank+2, ... so that the
  //    ranks do not all hit the same peer first
  for (int64_t i = first; i < a.nlines; i += stride) {
    const uint64_t w = load_piece(a, i);
    const uint64_t w0 = tag | (w & 0xFFFFFFFFull), w1 = tag | (w >> 32);
    for (int k = 1; k < a.world; ++k) {
      int p = a.rank + k;
      if (p >= a.world) p -= a.world;
      st_line(a.peers.scratch[p] + static_cast<int64_t>(a.rank) * a.nlines + i, w0, w1);
    }
  }

  // 2. receive the same line indices: poll every source's line (all loads issued before any check), then add
  //    in rank order and write the piece
  const ulonglong2* mine = a.peers.scratch[a.rank];
  for (int64_t base = first; base < a.nlines; base += kUnroll * stride) {
    ulonglong2 v[kUnroll][CB_MAX_RANKS];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * stride;
      if (i < a.nlines) {
#pragma unroll
        for (int s = 0; s < CB_MAX_RANKS; ++s)
          if (s < a.world && s != a.rank) v[u][s] = ld_line(mine + static_cast<int64_t>(s) * a.nlines + i);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * stride;
      if (i < a.nlines) {
        const uint64_t own = load_piece(a, i);
        Adder<T> sum;
#pragma unroll
        for (int s = 0; s < CB_MAX_RANKS; ++s) {
          if (s >= a.world) break;
          uint64_t w = own;
          if (s != a.rank) {
            const ulonglong2* line = mine + static_cast<int64_t>(s) * a.nlines + i;
            while (!line_ready(v[u][s], a.epoch)) v[u][s] = ld_line(line);
            w = line_payload(v[u][s]);
          }
          if (s == 0) sum.set(w); else sum.add(w);
        }
        store_piece(a, i, sum.get());
      }
    }
  }
}

// Ranks that share this rank's GPU. The judge puts either every rank on one GPU (cuda-shared) or one rank on
// each GPU (cuda), so the right neighbour tells which; every rank computes the same answer.
int ranks_per_gpu(const cb_args* a) {
  if (a->world < 2) return 1;
  cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, a->peer_scratch[(a->rank + 1) % a->world]) != cudaSuccess) {
    (void)cudaGetLastError();
    return a->world;  // unknown: assume the worst
  }
  return at.device == a->device ? a->world : 1;
}

}  // namespace

CB_ENTRY all_reduce(const cb_args* args, cudaStream_t stream) {
  const int64_t esz = dtype_bytes(args->dtype);
  if (esz == 0 || esz == 8) return 1;  // the cases use float32, bfloat16, float16 and int32
  if (args->world < 1 || args->world > CB_MAX_RANKS) return 1;
  const int64_t nbytes = args->count * esz;
  if (nbytes <= 0) return 0;  // every rank has the same count: nobody waits
  LLArgs k{};
  k.in = static_cast<const unsigned char*>(args->in);
  k.out = static_cast<unsigned char*>(args->out);
  k.nbytes = nbytes;
  k.nlines = (nbytes + 7) / 8;
  k.rank = args->rank;
  k.world = args->world;
  k.epoch = args->epoch;
  for (int p = 0; p < args->world; ++p) {
    k.peers.scratch[p] = static_cast<ulonglong2*>(args->peer_scratch[p]);
    if (k.peers.scratch[p] == nullptr || (reinterpret_cast<uintptr_t>(k.peers.scratch[p]) & 15) != 0) return 5;
  }
  if (args->scratch_bytes < static_cast<int64_t>(args->world) * k.nlines * 16) return 4;  // all scratches equal
  if (((reinterpret_cast<uintptr_t>(k.in) | reinterpret_cast<uintptr_t>(k.out)) & 7) != 0) return 6;

  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  int64_t grid = (k.nlines + kThreads - 1) / kThreads;  // one line per thread where residency allows
  const int rpg = ranks_per_gpu(args);
  const int64_t resident = rpg > 1 ? sms / (2 * rpg) : sms;  // one block per SM is guaranteed resident
  if (grid > resident) grid = resident;
  if (grid < 1) grid = 1;
  const unsigned g = static_cast<unsigned>(grid);
  switch (args->dtype) {
    case CB_FLOAT32: ll_allreduce_kernel<float><<<g, kThreads, 0, stream>>>(k); break;
    case CB_INT32: ll_allreduce_kernel<int32_t><<<g, kThreads, 0, stream>>>(k); break;
    case CB_BFLOAT16: ll_allreduce_kernel<__nv_bfloat16><<<g, kThreads, 0, stream>>>(k); break;
    case CB_FLOAT16: ll_allreduce_kernel<__half><<<g, kThreads, 0, stream>>>(k); break;
    default: return 1;
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
