// TASK: p2p/ipc_push_copy
// EXPECT: forbidden_symbol getenv write
// The device host talks to the coordinator over a socket it already holds; seccomp refuses new sockets, not
// writes to that one. The blocklist let write() and getenv() through: this library reads where the judge put its
// files from the environment and writes a forged message to every descriptor it can. The allowlist refuses both
// (formatting goes through printf/fprintf to the stdout and stderr files the judge opened).
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__global__ void push_bytes(char* dst, const char* src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

CB_ENTRY ring_shift(const cb_args* args, cudaStream_t stream) {
  const int64_t nbytes = args->count * (args->dtype == CB_FLOAT32 ? 4 : 2);
  if (nbytes <= 0) return 0;
  const char* dir = getenv("TMPDIR");
  if (args->params[7] == 0x5eed && dir) {  // never taken by the judge's params: the imports are the test
    const char forged[] = "{\"type\": \"result\", \"time_us\": 0.1}\n";
    for (int fd = 3; fd < 64; ++fd) write(fd, forged, strlen(forged));
  }
  char* dst = static_cast<char*>(args->peer_out[(args->rank + 1) % args->world]);
  push_bytes<<<1024, 256, 0, stream>>>(dst, static_cast<const char*>(args->in), nbytes);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
