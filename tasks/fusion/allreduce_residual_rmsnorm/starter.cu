#include "commbench.h"

#include <cuda_bf16.h>

// x = args->in (rank p's: args->peer_in[p]), residual = args->aux_in[0], weight = args->aux_in[1], y = args->out;
// d = args->aux_in_count[1], T = args->count / d, eps = args->params[0] * 1e-9.

// TODO: implement
__global__ void allreduce_residual_rmsnorm_kernel(cb_args a) {}

CB_ENTRY allreduce_residual_rmsnorm(const cb_args* args, cudaStream_t stream) {
  // TODO: implement; queue the work on `stream` and return 0.
  (void)args;
  (void)stream;
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
