#include "commbench.h"

// TODO: for every rank j, copy block `rank` of j's input (args->peer_in[j]) into block j of this rank's output
// (blocks of args->count / world elements), with 16-byte accesses where the addresses allow.
__global__ void alltoall_kernel(cb_args a, long long block_bytes) {}

CB_ENTRY all_to_all(const cb_args* args, cudaStream_t stream) {
  // TODO: compute the block size in bytes from args->count, args->world and args->dtype; launch on `stream`.
  (void)args;
  (void)stream;
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
