#include "commbench.h"

// TODO: implement
__global__ void ring_shift_kernel(cb_args a) {}

CB_ENTRY ring_shift(const cb_args* args, cudaStream_t stream) {
  // TODO: implement; queue the work on `stream` (and on streams you join back to it) and return 0.
  (void)args;
  (void)stream;
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
