#include "commbench.h"

// TODO: copy `nbytes` bytes from `src` (this rank's input) into `dst` (the right neighbour's output).
// Use 16-byte loads and stores where both addresses allow them; handle the bytes that do not fill a word.
__global__ void push_kernel(char* dst, const char* src, long long nbytes) {}

CB_ENTRY ring_shift(const cb_args* args, cudaStream_t stream) {
  const int right = (args->rank + 1) % args->world;
  (void)right;
  // TODO: launch push_kernel on `stream` with dst = args->peer_out[right] and src = args->in;
  //       the byte count is args->count times the size of one element of args->dtype.
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
