// Reference: ring shift (rank r's input into the output of rank r + 1) by the engine that suits the size.
//
//   below kSplitMin (8 MiB): one SM copy kernel, pushing into the right neighbour's output, with a grid sized to
//     the data (one 512-thread block per 32 KiB, at most two waves). Nothing else: a copy-engine transfer adds its
//     own start-up (the runtime writes a copy descriptor that the engine then fetches), and running both at once
//     needs a fork and a join of a second stream (an event record and a stream wait on each side), each costing
//     microseconds, as much as the whole transfer at these sizes (1 MiB is 2-3 us at 350-450 GB/s).
//   from kSplitMin on: both engines at once. The copy engine (cudaMemcpyAsync on a side stream, forked from and
//     joined back to the call's stream with events) moves the first share of the bytes while the SM kernel moves
//     the rest; both start at once, so the call takes max(CE part / CE rate, SM part / SM rate) plus the fork.
//
// Published figures behind the thresholds and shares (not measured here; the GPU validation confirms them):
//   - NVLink 4 on H100/H200 SXM: 18 links x 25 GB/s = 450 GB/s per direction (NVIDIA's H100/H200 data sheets,
//     900 GB/s bidirectional).
//   - This project's own figures on 2 x H200: the SM push kernel (p2p/ipc_push_copy's reference) moves 64 MiB in
//     190 us (352 GB/s, 74 % of the 478 GB/s that nvidia-smi reports) and 1 MiB in 9 us
//     (benchmarks/results/gpu_stream_checks-2026-11-30-2gpu.md); in cuda-shared it reaches 87-103 % of the
//     device copy rate (about 2.1 TB/s on one H200) at 64 MiB
//     (benchmarks/results/gpu_validate-2026-12-01-1gpu-cuda-shared-w2_4.md).
//   - Copy-engine peer writes over H100 NVLink are commonly reported (NVIDIA's nvbandwidth tool,
//     device_to_device_memcpy_write_ce) at roughly 80-90 % of the link, like the SM kernel above: neither
//     saturates the link by itself, and driving it from both at once is the way to get closer to its rate, which
//     is what the split is for. (Not checked here: the GPU validation tells whether the split beats either alone.)
//   - Launch overheads: a kernel or a copy costs a few microseconds from the start of the stream to its end on
//     Hopper, and every cross-stream event dependency adds a microsecond or two (the judge measures about 3 us
//     for its own legacy-stream stop mark). So the split pays off only where the transfer takes tens of
//     microseconds: 8 MiB is 19-24 us at 350-450 GB/s.
// Shares: with one GPU per rank (`cuda`), half of the bytes go to the copy engine (both engines are near the same
// rate on NVLink); in `cuda-shared` the bound is HBM, which the SM kernel alone nearly saturates, and all ranks'
// copies contend for the same engines, so the copy engine takes a quarter.
//
// No flag is needed: the judge finishes every output fill before any call starts and synchronises every device
// after all calls, so rank r+1's output is complete when it is read. The side stream and the two events are made
// once per rank (each rank loads its own copy of this library) and kept: they are handles, not data, and are made
// again if the device ever differs.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;                    // 16-byte words in flight per thread before its first store
constexpr int64_t kSplitMin = 8ll << 20;      // from here on, copy engine and SM kernel at once
constexpr int64_t kBlockBytes = static_cast<int64_t>(kThreads) * kUnroll * 16;  // 32 KiB per block round

int64_t dtype_bytes(int dtype) {
  switch (dtype) {
    case CB_FLOAT64: case CB_INT64: return 8;
    case CB_FLOAT32: case CB_INT32: return 4;
    case CB_FLOAT16: case CB_BFLOAT16: return 2;
    case CB_UINT8: return 1;
    default: return 0;
  }
}

// n bytes from src to dst (both 16-byte aligned: the buffers are 256-byte aligned and the split points are
// multiples of 4 KiB): 16-byte words, kUnroll loads in flight before their stores, then the last n % 16 bytes.
__global__ void __launch_bounds__(kThreads) push_kernel(char* __restrict__ dst, const char* __restrict__ src,
                                                        int64_t n) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t nthreads = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t nw = n / 16;
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* d = reinterpret_cast<uint4*>(dst);
  int64_t i = tid;
  for (; i + (kUnroll - 1) * nthreads < nw; i += kUnroll * nthreads) {
    uint4 r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) r[u] = __ldcs(s + i + u * nthreads);  // read once: evict first
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) d[i + u * nthreads] = r[u];
  }
  for (; i < nw; i += nthreads) d[i] = __ldcs(s + i);
  const int64_t tail = n - nw * 16;
  if (tid < tail) dst[nw * 16 + tid] = src[nw * 16 + tid];
}

int launch_push(char* dst, const char* src, int64_t n, int sms, cudaStream_t stream) {
  if (n <= 0) return 0;
  int64_t blocks = (n + kBlockBytes - 1) / kBlockBytes;
  if (blocks > 2 * static_cast<int64_t>(sms)) blocks = 2 * static_cast<int64_t>(sms);  // grid-stride beyond
  push_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(dst, src, n);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}

// The side stream and the fork/join events of this rank, made on first use.
struct Side {
  int device = -1;
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
};
Side g_side;

bool side_ready(int device) {
  if (g_side.device == device && g_side.stream && g_side.fork && g_side.join) return true;
  Side s;
  s.device = device;
  if (cudaStreamCreate(&s.stream) != cudaSuccess ||
      cudaEventCreateWithFlags(&s.fork, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventCreateWithFlags(&s.join, cudaEventDisableTiming) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  g_side = s;  // handles of an earlier device are left alone (never seen: a rank keeps its GPU)
  return true;
}

// Ranks that share this rank's GPU: the judge puts either every rank on one GPU (cuda-shared) or one rank on
// each GPU (cuda), so the right neighbour tells which.
bool shares_gpu(const cb_args* a) {
  if (a->world < 2) return true;
  cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, a->peer_out[(a->rank + 1) % a->world]) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  return at.device == a->device;
}

}  // namespace

CB_ENTRY ring_shift(const cb_args* args, cudaStream_t stream) {
  const int64_t esz = dtype_bytes(args->dtype);
  if (esz == 0) return 1;
  const int64_t nbytes = args->count * esz;
  if (nbytes <= 0) return 0;
  char* dst = static_cast<char*>(args->peer_out[(args->rank + 1) % args->world]);
  const char* src = static_cast<const char*>(args->in);
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;

  if (nbytes < kSplitMin || !side_ready(args->device)) return launch_push(dst, src, nbytes, sms, stream);

  // both at once: the copy engine takes the first ce bytes (a multiple of 4 KiB), the SM kernel the rest
  const int64_t share_div = shares_gpu(args) ? 4 : 2;
  const int64_t ce = nbytes / share_div / 4096 * 4096;
  if (cudaEventRecord(g_side.fork, stream) != cudaSuccess ||
      cudaStreamWaitEvent(g_side.stream, g_side.fork, 0) != cudaSuccess ||
      cudaMemcpyAsync(dst, src, static_cast<size_t>(ce), cudaMemcpyDefault, g_side.stream) != cudaSuccess ||
      cudaEventRecord(g_side.join, g_side.stream) != cudaSuccess)
    return 3;
  const int rc = launch_push(dst + ce, src + ce, nbytes - ce, sms, stream);
  if (cudaStreamWaitEvent(stream, g_side.join, 0) != cudaSuccess) return 3;  // joined whatever the launch did
  return rc;
}
