// TASK: p2p/ipc_push_copy
// EXPECT: forbidden_symbol syscall
// The blocklist named open, openat, socket, fork, kill, prctl, ... but not the generic syscall(2) wrapper, which
// issues every one of them by number. Here a call opens a file and keeps a byte of state between evaluations in
// it (the cache the card forbids). The allowlist refuses `syscall` at build time; seccomp in the rank refuses
// some of what it can reach (fork, new sockets), not this file.
#include "commbench.h"

#include <cuda_runtime.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

__global__ void push_bytes(char* dst, const char* src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

CB_ENTRY ring_shift(const cb_args* args, cudaStream_t stream) {
  const int64_t nbytes = args->count * (args->dtype == CB_FLOAT32 ? 4 : 2);
  long fd = args->params[7] == 0x5eed  // never taken by the judge's params: the import is the test
                ? syscall(SYS_openat, AT_FDCWD, "commbench-state", O_RDWR | O_CREAT, 0600) : -1;
  if (fd >= 0) {
    char seen = 0;
    syscall(SYS_read, fd, &seen, 1);
    syscall(SYS_write, fd, "1", 1);
    syscall(SYS_close, fd);
  }
  if (nbytes <= 0) return 0;
  char* dst = static_cast<char*>(args->peer_out[(args->rank + 1) % args->world]);
  push_bytes<<<1024, 256, 0, stream>>>(dst, static_cast<const char*>(args->in), nbytes);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
