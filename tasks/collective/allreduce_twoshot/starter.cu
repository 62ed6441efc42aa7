#include "commbench.h"

#include <cuda_bf16.h>

// TODO: one kernel (or several on `stream`) that
//   1. reduce-scatters: sums this rank's slice of every rank's input (float32 accumulation) into this rank's
//      `out` (or `scratch`),
//   2. signals every peer by storing args->epoch into its flag words and waits until every peer has signalled
//      this rank (release/acquire at system scope),
//   3. all-gathers: copies every other slice from its owner's buffer into this rank's `out`.
template <typename T>
__global__ void twoshot_kernel(cb_args a) {
  // TODO
}

CB_ENTRY all_reduce(const cb_args* args, cudaStream_t stream) {
  // TODO: choose a grid that covers the work (a grid that spins must stay small: see the prompt) and launch on `stream`.
  switch (args->dtype) {
    case CB_FLOAT32: twoshot_kernel<float><<<1, 256, 0, stream>>>(*args); break;
    case CB_BFLOAT16: twoshot_kernel<__nv_bfloat16><<<1, 256, 0, stream>>>(*args); break;
    default: return 1;  // the cases use float32 and bfloat16 only
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
