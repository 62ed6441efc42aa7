#include "commbench.h"

// root = args->params[0] (negative: counted from the end). Only the root has an output buffer.

// TODO: implement
__global__ void reduce_kernel(cb_args a) {}

CB_ENTRY reduce(const cb_args* args, cudaStream_t stream) {
  // TODO: implement; queue the work on `stream` and return 0.
  (void)args;
  (void)stream;
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
