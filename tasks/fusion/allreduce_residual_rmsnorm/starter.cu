#include "commbench.h"

#include <cuda_bf16.h>

// TODO: for every row t of the [T, d] tensors:
//   h[j] = sum over p < world of x_p[t, j] + residual[t, j]            (x_p = args->peer_in[p], float32 sums)
//   y[t, j] = h[j] / sqrt(mean over j of h[j]^2 + eps) * weight[j]     (into args->out)
// with d = args->aux_in_count[1], T = args->count / d, eps = args->params[0] * 1e-9,
// residual = args->aux_in[0], weight = args->aux_in[1].
template <typename T>
__global__ void fused_kernel(cb_args a) {
  // TODO
}

CB_ENTRY allreduce_residual_rmsnorm(const cb_args* args, cudaStream_t stream) {
  // TODO: choose a grid that covers the work (a grid that spins must stay small: see the prompt) and launch on `stream`.
  switch (args->dtype) {
    case CB_FLOAT32: fused_kernel<float><<<1, 256, 0, stream>>>(*args); break;
    case CB_BFLOAT16: fused_kernel<__nv_bfloat16><<<1, 256, 0, stream>>>(*args); break;
    default: return 1;  // the cases use float32 and bfloat16 only
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
