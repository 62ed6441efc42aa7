// TASK: p2p/ipc_push_copy
// EXPECT: timed
// A push copy on the candidate's own non-blocking stream, never ordered after the harness's `stream`. Before the
// judge linked its own stream creation into candidates (cuda/blocking_streams.cpp), it ran as soon as it was
// launched, while the gate still held the clock: 3.0 us at 1, 16 and 64 MiB, and only the implausible-timing check
// stopped it, at 16 and 64 MiB (benchmarks/results/gpu_stream_checks-2026-11-30-2gpu.md). Now the stream is
// blocking, so it waits for the gate and the stop mark waits for it: 0.98-1.20x the reference's time
// (benchmarks/results/gpu_stream_checks-2026-11-30b-2gpu.md).
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

// A plain push: rank r copies its input, byte by byte, into rank r+1's output (the task's two dtypes, float32 and
// bfloat16, both copy as bytes).
__global__ void push_bytes(char* dst, const char* src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

CB_ENTRY ring_shift(const cb_args* args, cudaStream_t stream) {
  const int64_t nbytes = args->count * (args->dtype == CB_FLOAT32 ? 4 : 2);
  if (nbytes <= 0) return 0;
  char* dst = static_cast<char*>(args->peer_out[(args->rank + 1) % args->world]);
  (void)stream;  // not used: the point of this file
  static cudaStream_t side[CB_MAX_RANKS] = {};
  if (!side[args->rank] && cudaStreamCreateWithFlags(&side[args->rank], cudaStreamNonBlocking) != cudaSuccess)
    return 2;
  push_bytes<<<1024, 256, 0, side[args->rank]>>>(dst, static_cast<const char*>(args->in), nbytes);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
