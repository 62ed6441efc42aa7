#include "commbench.h"

#include <cuda_bf16.h>

// x of rank p = args->peer_in[p] [T, d]; bias = args->aux_in[0] [d], d = args->aux_in_count[0];
// y of rank p = args->peer_out[p] [T, d]; every rank's y = gelu(sum_p x_p + bias).

// TODO: implement
__global__ void allreduce_bias_gelu_kernel(cb_args a) {}

CB_ENTRY allreduce_bias_gelu(const cb_args* args, cudaStream_t stream) {
  // TODO: implement; queue the work on `stream` and return 0.
  (void)args;
  (void)stream;
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
