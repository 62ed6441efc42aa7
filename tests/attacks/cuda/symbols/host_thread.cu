// TASK: p2p/ipc_push_copy
// EXPECT: forbidden_symbol pthread_create
// A host thread that outlives the call: the entry point returns at once (the clock stops when the work it queued
// on `stream` is done, which is nothing) and the thread does the copy afterwards, on a stream of its own. The
// blocklist let pthread_create (and std::thread, which calls it) through; the allowlist has neither.
#include "commbench.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>

__global__ void push_bytes(char* dst, const char* src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

namespace {
struct Job {
  char* dst;
  const char* src;
  int64_t n;
};

void* late_copy(void* arg) {
  Job* job = static_cast<Job*>(arg);
  cudaStream_t mine;
  cudaStreamCreate(&mine);
  push_bytes<<<1024, 256, 0, mine>>>(job->dst, job->src, job->n);
  return nullptr;
}
}  // namespace

CB_ENTRY ring_shift(const cb_args* args, cudaStream_t stream) {
  (void)stream;
  const int64_t nbytes = args->count * (args->dtype == CB_FLOAT32 ? 4 : 2);
  if (nbytes <= 0) return 0;
  static Job jobs[CB_MAX_RANKS];
  jobs[args->rank] = {static_cast<char*>(args->peer_out[(args->rank + 1) % args->world]),
                      static_cast<const char*>(args->in), nbytes};
  pthread_t t;
  if (pthread_create(&t, nullptr, late_copy, &jobs[args->rank]) != 0) return 2;
  pthread_detach(t);
  return 0;
}
