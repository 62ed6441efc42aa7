// Reference: ring shift with an LL128-style protocol (128-byte lines, 120 payload bytes and one 8-byte flag each).
//
// The input is cut into 120-byte pieces (the last one zero-padded); piece i travels as line i of the right
// neighbour's scratch: 15 payload words of 8 bytes, then one flag word holding this call's epoch. Eight lanes of
// a warp own one line, 16 bytes each (lane j of the eight: words 2j and 2j+1; lane 7's second word is the flag),
// so one warp-wide st.volatile.global.v2.u64 writes four whole, aligned 128-byte lines. The receiver loads the
// four lines with one warp-wide ld.volatile.global.v2.u64 and accepts them when every flag lane sees the epoch
// (__any_sync over the warp; otherwise the whole warp loads again): no fence and no separate flag, like LL, but
// with 8 flag bytes per 120 payload bytes instead of 8 per 8.
//
// What this relies on (as NCCL's LL128 does): a warp's 16-byte stores that cover one aligned 128-byte line reach
// memory as one transaction, and a warp's 16-byte loads of one line see it whole, so a line whose flag is fresh
// holds fresh data. The PTX memory model promises single-copy atomicity only up to 8 bytes (16 for some vector
// forms); NCCL enables LL128 only where the hardware keeps whole lines (NVLink, sm_70 and later), and a torn line
// would show up here as a wrong output.
//
// Flags are the epoch (1, 2, 3, ... one per call, the same on every rank): a line left from an earlier call (or
// zeroed scratch) never matches, so nothing is reset. The judge synchronises every device between calls, so a
// line is never overwritten by the next call before it was read. A line is written once per call: the scratch
// holds ceil(bytes / 120) lines, 1.067 times the input plus one line.
//
// Work: groups of kLinesPerGroup consecutive lines (kSteps warp-wide accesses of 4 lines); warp w of the grid owns
// groups w, w + W, w + 2W, ... In its k-th round a warp sends group k and then receives group k - 1, which the
// left neighbour's warp w sent a round earlier, so the lines are usually there already (and in cuda-shared often
// still in the L2). Every rank launches the same grid (same count, world and device), so warp w of rank r waits
// only for warp w of rank r - 1 in an earlier round: no cycle. Receivers spin, so every block of every rank
// sharing a GPU must be resident at once: the grid is the blocks that fit (occupancy query, capped) divided by
// the ranks sharing the GPU.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kSteps = 8;                      // warp-wide line accesses in flight per round
constexpr int kLinesPerGroup = 4 * kSteps;     // a warp-wide access covers 4 lines
constexpr int kMaxBlocksPerSm = 4;
constexpr int64_t kPayload = 120;              // payload bytes per line
constexpr int64_t kLine = 128;

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
  const unsigned char* in;   // this rank's input
  unsigned char* out;        // this rank's output
  unsigned char* send;       // the right neighbour's scratch (lines)
  const unsigned char* recv; // this rank's scratch (lines)
  int64_t nbytes;
  int64_t nlines;            // ceil(nbytes / 120)
  int64_t ngroups;           // ceil(nlines / kLinesPerGroup)
  unsigned long long flag;   // this call's epoch
};

__device__ __forceinline__ void st_v2(void* p, unsigned long long a, unsigned long long b) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}

__device__ __forceinline__ void ld_v2(const void* p, unsigned long long& a, unsigned long long& b) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}

// The 8 input bytes at offset o (a multiple of 8), zero past the end (little-endian, as an 8-byte load gives them).
__device__ __forceinline__ unsigned long long load_word(const Args& a, int64_t o) {
  if (o + 8 <= a.nbytes) return __ldcs(reinterpret_cast<const unsigned long long*>(a.in + o));
  unsigned long long v = 0;
  for (int b = 0; b < 8 && o + b < a.nbytes; ++b) v |= static_cast<unsigned long long>(a.in[o + b]) << (8 * b);
  return v;
}

// Writes the 8 bytes at output offset o: only those that exist.
__device__ __forceinline__ void store_word(const Args& a, int64_t o, unsigned long long v) {
  if (o + 8 <= a.nbytes) {
    *reinterpret_cast<unsigned long long*>(a.out + o) = v;
    return;
  }
  for (int b = 0; b < 8 && o + b < a.nbytes; ++b) a.out[o + b] = static_cast<unsigned char>(v >> (8 * b));
}

__device__ __forceinline__ void send_group(const Args& a, int64_t g, int sub, int j) {
  unsigned long long w0[kSteps], w1[kSteps];
#pragma unroll
  for (int u = 0; u < kSteps; ++u) {  // every load of the group first, then the stores
    const int64_t line = g * kLinesPerGroup + 4 * u + sub;
    if (line < a.nlines) {
      const int64_t o = line * kPayload + 16 * j;
      w0[u] = load_word(a, o);
      w1[u] = j < 7 ? load_word(a, o + 8) : a.flag;
    }
  }
#pragma unroll
  for (int u = 0; u < kSteps; ++u) {
    const int64_t line = g * kLinesPerGroup + 4 * u + sub;
    if (line < a.nlines) st_v2(a.send + line * kLine + 16 * j, w0[u], w1[u]);
  }
}

__device__ __forceinline__ void recv_group(const Args& a, int64_t g, int sub, int j) {
  unsigned long long w0[kSteps], w1[kSteps];
#pragma unroll
  for (int u = 0; u < kSteps; ++u) {  // every line of the group polled at once
    const int64_t line = g * kLinesPerGroup + 4 * u + sub;
    w0[u] = 0;
    w1[u] = a.flag;
    if (line < a.nlines) ld_v2(a.recv + line * kLine + 16 * j, w0[u], w1[u]);
  }
#pragma unroll
  for (int u = 0; u < kSteps; ++u) {
    const int64_t line = g * kLinesPerGroup + 4 * u + sub;
    const bool valid = line < a.nlines;  // the same for the 8 lanes of a line
    // Warp-uniform loop: every lane takes part in __any_sync; a stale flag anywhere reloads all four lines.
    while (__any_sync(0xffffffffu, valid && j == 7 && w1[u] != a.flag)) {
      if (valid) ld_v2(a.recv + line * kLine + 16 * j, w0[u], w1[u]);
    }
    if (valid) {
      const int64_t o = line * kPayload + 16 * j;
      store_word(a, o, w0[u]);
      if (j < 7) store_word(a, o + 8, w1[u]);
    }
  }
}

__global__ void __launch_bounds__(kThreads) ll128_kernel(const __grid_constant__ Args a) {
  const int lane = threadIdx.x & 31;
  const int sub = lane >> 3;  // which of the 4 lines of a warp-wide access
  const int j = lane & 7;     // which 16 bytes of that line
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * kWarps;
  // Round k: send group warp + k * nwarps, then receive the group sent in round k - 1. Warp-uniform throughout.
  int64_t prev = -1;
  for (int64_t g = warp;; g += nwarps) {
    if (g < a.ngroups) send_group(a, g, sub, j);
    if (prev >= 0) recv_group(a, prev, sub, j);
    if (g >= a.ngroups) break;
    prev = g;
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
  Args k{};
  k.in = static_cast<const unsigned char*>(args->in);
  k.out = static_cast<unsigned char*>(args->out);
  k.send = static_cast<unsigned char*>(args->peer_scratch[(args->rank + 1) % args->world]);
  k.recv = static_cast<const unsigned char*>(args->scratch);
  k.nbytes = nbytes;
  k.nlines = (nbytes + kPayload - 1) / kPayload;
  k.ngroups = (k.nlines + kLinesPerGroup - 1) / kLinesPerGroup;
  k.flag = args->epoch;
  if (args->scratch_bytes < k.nlines * kLine) return 4;  // every rank's scratch has our size
  if (((reinterpret_cast<uintptr_t>(k.send) | reinterpret_cast<uintptr_t>(k.recv)) & (kLine - 1)) != 0) return 5;
  if ((reinterpret_cast<uintptr_t>(k.in) | reinterpret_cast<uintptr_t>(k.out)) & 7) return 5;

  int sms = 0, per_sm = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ll128_kernel, kThreads, 0) != cudaSuccess) return 2;
  if (per_sm > kMaxBlocksPerSm) per_sm = kMaxBlocksPerSm;
  if (per_sm < 1) per_sm = 1;
  const int64_t resident = static_cast<int64_t>(sms) * per_sm / ranks_per_gpu(args);
  int64_t grid = (k.ngroups + kWarps - 1) / kWarps;
  if (grid > resident) grid = resident;
  if (grid < 1) grid = 1;
  ll128_kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(k);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
