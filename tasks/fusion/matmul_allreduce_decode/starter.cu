#include "commbench.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// K = args->params[0]; M = args->count / K; N = args->aux_in_count[0] / K.
// x_r = args->in [M, K]; w_r = args->aux_in[0] [N, K]; y = args->out [M, N] (every rank: the sum over ranks).

// TODO: implement
__global__ void matmul_allreduce_kernel(cb_args a) {}

CB_ENTRY matmul_allreduce(const cb_args* args, cudaStream_t stream) {
  // TODO: implement; queue the work on `stream` and return 0.
  (void)args;
  (void)stream;
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
