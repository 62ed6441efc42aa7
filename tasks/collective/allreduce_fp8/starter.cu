#include "commbench.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

// block = args->params[0]; x = args->in (args->count elements of args->dtype: CB_FLOAT32 or CB_BFLOAT16).
// Every rank's args->out: the sum over ranks, within the bound of the prompt, the same bits on every rank.

// TODO: implement
__global__ void all_reduce_kernel(cb_args a) {}

CB_ENTRY all_reduce(const cb_args* args, cudaStream_t stream) {
  // TODO: implement; queue the work on `stream` and return 0.
  (void)args;
  (void)stream;
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
