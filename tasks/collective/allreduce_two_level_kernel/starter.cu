#include "commbench.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// TODO: implement the two-level all-reduce.
__global__ void all_reduce_kernel(cb_args a) {}

CB_ENTRY all_reduce(const cb_args* args, cudaStream_t stream) {
  // TODO: implement; queue the work on `stream` and return 0.
  (void)args;
  (void)stream;
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
