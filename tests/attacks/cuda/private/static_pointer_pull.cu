// TASK: p2p/tma_bulk_push
// EXPECT: wrong_answer
// Inputs are private in this task (a peer's `peer_in` is NULL): data must be pushed into the right neighbour's output.
// This submission pulls instead: every rank's host code publishes its input pointer in a static, and each rank
// copies its left neighbour's input into its own output. All ranks of a CUDA task run in one device-host process,
// so one static would be shared by all of them; the judge loads a copy of the library per rank, so each rank's
// static is its own and the left neighbour's pointer never appears: the pull finds nothing and the output is wrong.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

static void* volatile g_inputs[CB_MAX_RANKS];
static volatile int g_epoch[CB_MAX_RANKS];

__global__ void pull_bytes(char* dst, const char* src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

CB_ENTRY ring_shift(const cb_args* args, cudaStream_t stream) {
  const int64_t nbytes = args->count * (args->dtype == CB_FLOAT32 ? 4 : 2);
  if (nbytes <= 0) return 0;
  g_inputs[args->rank] = const_cast<void*>(args->in);
  g_epoch[args->rank] = args->epoch;
  const int left = (args->rank + args->world - 1) % args->world;
  for (long spin = 0; spin < 20000000L && g_epoch[left] != args->epoch; ++spin) {
  }
  if (g_epoch[left] != args->epoch) return 0;  // no peer pointer in sight: give up, leaving the output unwritten
  pull_bytes<<<1024, 256, 0, stream>>>(static_cast<char*>(args->out), static_cast<const char*>(g_inputs[left]), nbytes);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
