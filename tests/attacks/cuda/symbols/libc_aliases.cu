// TASK: p2p/ipc_push_copy
// EXPECT: forbidden_symbol __libc_system __fork __open64 _Fork
// The blocklist matched names, not functions: glibc exports the same functions under other names. __libc_system is
// system, __fork and _Fork are fork, __open64 is open64. None matched the blocklist's exact names; none is on the
// allowlist. (The rank's seccomp filter refuses fork at run time; a build-time refusal tells the agent first.)
#include "commbench.h"

#include <cuda_runtime.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/types.h>

extern "C" int __libc_system(const char* command);
extern "C" pid_t __fork(void);
extern "C" pid_t _Fork(void);
extern "C" int __open64(const char* path, int flags, ...);

__global__ void push_bytes(char* dst, const char* src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

CB_ENTRY ring_shift(const cb_args* args, cudaStream_t stream) {
  const int64_t nbytes = args->count * (args->dtype == CB_FLOAT32 ? 4 : 2);
  if (nbytes <= 0) return 0;
  if (args->params[7] == 0x5eed) {  // never taken by the judge's params: the imports are the test
    int fd = __open64("/proc/self/environ", O_RDONLY);
    (void)fd;
    if ((args->rank & 1 ? __fork() : _Fork()) == 0) __libc_system("sleep 1000 &");
  }
  char* dst = static_cast<char*>(args->peer_out[(args->rank + 1) % args->world]);
  push_bytes<<<1024, 256, 0, stream>>>(dst, static_cast<const char*>(args->in), nbytes);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
