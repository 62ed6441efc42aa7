#include "commbench.h"

#include <cuda_fp8.h>

// experts_per_rank = args->params[0], k = args->params[1], T = args->aux_in_count[0] / k, d = args->count / T,
// nb = (d + 127) / 128 scales per row. __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3) makes one e4m3 code.

// TODO: implement
__global__ void dispatch_kernel(cb_args a) {}

CB_ENTRY dispatch(const cb_args* args, cudaStream_t stream) {
  // TODO: implement; queue the work on `stream` and return 0.
  (void)args;
  (void)stream;
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
