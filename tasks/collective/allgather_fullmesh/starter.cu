#include "commbench.h"

// TODO: for every rank p, copy p's input (args->peer_in[p], args->count elements) into block p of this rank's
// output (args->out, world blocks of args->count elements), with 16-byte accesses where the addresses allow.
__global__ void gather_kernel(cb_args a, long long block_bytes) {}

CB_ENTRY all_gather(const cb_args* args, cudaStream_t stream) {
  // TODO: compute the block size in bytes from args->count and args->dtype, and launch on `stream`.
  (void)args;
  (void)stream;
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
