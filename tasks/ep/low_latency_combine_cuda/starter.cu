#include "commbench.h"

// experts_per_rank = args->params[0], k = args->params[1], E = experts_per_rank * world,
// M = args->aux_in_count[0] / E, d = args->count / args->aux_in_count[0], T = args->aux_in_count[2] / k (may be 0).

// TODO: implement
__global__ void low_latency_combine_kernel(cb_args a) {}

CB_ENTRY low_latency_combine(const cb_args* args, cudaStream_t stream) {
  // TODO: implement; queue the work on `stream` and return 0.
  (void)args;
  (void)stream;
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
