#include "commbench.h"

#include <stdint.h>

// out[q * args->count + k] = value k of rank q (its own included); values are float32, bfloat16 or float64
// (4, 2 or 8 bytes each).

// TODO: implement
__global__ void barrier_rounds_kernel(cb_args a) {}

CB_ENTRY barrier_rounds(const cb_args* args, cudaStream_t stream) {
  // TODO: implement; queue the work on `stream` and return 0.
  (void)args;
  (void)stream;
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
