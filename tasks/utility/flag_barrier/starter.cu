#include "commbench.h"

#include <stdint.h>

// TODO: `rounds` rounds; in round k:
//   1. write in[k] into this rank's own scratch (two slots, k % 2, so a fast peer cannot overwrite a slot that a
//      slow rank is still reading);
//   2. barrier: signal every peer q through args->peer_flags[q] (release, system scope), then wait until every
//      peer has signalled round k in this rank's args->flags (acquire); flag values built from args->epoch;
//   3. out[q * rounds + k] = the value rank q wrote into its scratch slot in this round, for every q.
// Values are 4 bytes here (float32); bfloat16 (2 bytes) and float64 (8 bytes) must work too.
__global__ void barrier_kernel(cb_args a) {
  // TODO
}

CB_ENTRY barrier_rounds(const cb_args* args, cudaStream_t stream) {
  // one warp: every rank's spinning kernel must be resident at the same time
  barrier_kernel<<<1, 32, 0, stream>>>(*args);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
