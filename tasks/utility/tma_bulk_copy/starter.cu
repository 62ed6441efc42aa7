#include "commbench.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// rows = args->aux_out_count[0], d = args->count / rows, eps = args->params[0] * 1e-9.

// TODO: implement
__global__ void row_rms_scale_kernel(cb_args a) {}

CB_ENTRY row_rms_scale(const cb_args* args, cudaStream_t stream) {
  // TODO: implement; queue the work on `stream` and return 0.
  (void)args;
  (void)stream;
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
