#include "commbench.h"

// k = args->aux_in_count[0] / args->world (experts per rank), elements per expert = args->count / k.

// TODO: implement
__global__ void rebalance_kernel(cb_args a) {}

CB_ENTRY rebalance(const cb_args* args, cudaStream_t stream) {
  // TODO: implement; queue the work on `stream` and return 0.
  (void)args;
  (void)stream;
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
