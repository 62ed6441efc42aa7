// TASK: p2p/ipc_push_copy
// EXPECT: timed
// The reference push copy, launched on the legacy default stream instead of the harness's `stream` (what a
// launch without a stream argument does). The judge's rank streams are blocking streams, so this work runs after
// the start event and before the done event: it must be timed like the reference, not read ~3 us.
// Reference: ring shift by pushing. Rank r writes its own input straight into the output of rank r+1 (remote
// stores over NVLink, or the same GPU in cuda-shared mode). Stores to a peer are posted writes, so a push is
// usually at least as fast as a pull. No flag is needed: the judge finishes every rank's output fill before any
// call starts and synchronises every device after all calls, so rank r+1's `out` is complete when it is read.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // words in flight per thread before the first store

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

// Copies `nwords` words of B bytes (both pointers B-aligned). Thread `tid` of `nthreads` takes words tid,
// tid + nthreads, ...; kUnroll loads are issued before their stores so that several stores stay in flight.
template <int B>
__device__ __forceinline__ void copy_words(char* dst, const char* src, int64_t nwords, int64_t tid, int64_t nthreads) {
  using W = typename Word<B>::type;
  const W* s = reinterpret_cast<const W*>(src);
  W* d = reinterpret_cast<W*>(dst);
  int64_t i = tid;
  for (; i + (kUnroll - 1) * nthreads < nwords; i += kUnroll * nthreads) {
    W r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) r[u] = s[i + u * nthreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) d[i + u * nthreads] = r[u];
  }
  for (; i < nwords; i += nthreads) d[i] = s[i];
}

// Copies n bytes with the widest word that dst and src can share: a head of bytes brings dst to that
// alignment (src follows, since both have the same offset modulo the word), then whole words, then a tail.
__device__ __forceinline__ void copy_bytes(char* dst, const char* src, int64_t n, int64_t tid, int64_t nthreads) {
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
    case 16: copy_words<16>(dst, src, body / 16, tid, nthreads); break;
    case 8: copy_words<8>(dst, src, body / 8, tid, nthreads); break;
    case 4: copy_words<4>(dst, src, body / 4, tid, nthreads); break;
    case 2: copy_words<2>(dst, src, body / 2, tid, nthreads); break;
    default: copy_words<1>(dst, src, body, tid, nthreads); break;
  }
}

__global__ void __launch_bounds__(kThreads) push_kernel(char* dst, const char* src, int64_t nbytes) {
  copy_bytes(dst, src, nbytes, static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x,
             static_cast<int64_t>(gridDim.x) * kThreads);
}

}  // namespace

CB_ENTRY ring_shift(const cb_args* args, cudaStream_t stream) {
  const int64_t esz = dtype_bytes(args->dtype);
  if (esz == 0) return 1;
  const int64_t nbytes = args->count * esz;
  if (nbytes <= 0) return 0;
  const int right = (args->rank + 1) % args->world;
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  const int64_t per_block = static_cast<int64_t>(kThreads) * kUnroll * 16;
  int64_t blocks = (nbytes + per_block - 1) / per_block;
  if (blocks > 2 * sms) blocks = 2 * sms;  // grid-stride beyond two waves
  if (blocks < 1) blocks = 1;
  push_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, 0>>>(
      static_cast<char*>(args->peer_out[right]), static_cast<const char*>(args->in), nbytes);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
