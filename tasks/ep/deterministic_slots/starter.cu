#include "commbench.h"

// epr = args->params[0], k = args->params[1], T = args->aux_in_count[0] / k, d = args->count / T.
// aux_in[0]: topk_idx int64 [T, k]; aux_in[1]: counts int32 [world, E]. out: recv_x [N_r, d].

// TODO: implement
__global__ void dispatch_kernel(cb_args a) {}

CB_ENTRY dispatch_expert_major(const cb_args* args, cudaStream_t stream) {
  // TODO: implement; queue the work on `stream` and return 0.
  (void)args;
  (void)stream;
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
