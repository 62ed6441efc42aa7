// TASK: p2p/ipc_push_copy
// EXPECT: forbidden_symbol mprotect
// mmap was blocked, mprotect was not: the library makes the page of a function it can reach (its own import of
// cudaEventRecord resolves to the runtime's code, which the judge also calls to mark the end of a call) writable
// and executable and patches it, so that the judge's own stop marks go where the candidate says. The patch here
// is a harmless return; the point is the import, which the allowlist refuses.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

__global__ void push_bytes(char* dst, const char* src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

static void patch_event_record() {
  const long page = sysconf(_SC_PAGESIZE);
  uintptr_t fn = reinterpret_cast<uintptr_t>(&cudaEventRecord);
  void* start = reinterpret_cast<void*>(fn & ~static_cast<uintptr_t>(page - 1));
  if (mprotect(start, static_cast<size_t>(page) * 2, PROT_READ | PROT_WRITE | PROT_EXEC) == 0) {
    // mov eax, 0 ; ret: every cudaEventRecord in the process "succeeds" and records nothing
    static const unsigned char ret0[] = {0xb8, 0x00, 0x00, 0x00, 0x00, 0xc3};
    for (unsigned i = 0; i < sizeof ret0; ++i) reinterpret_cast<volatile unsigned char*>(fn)[i] = ret0[i];
  }
}

CB_ENTRY ring_shift(const cb_args* args, cudaStream_t stream) {
  const int64_t nbytes = args->count * (args->dtype == CB_FLOAT32 ? 4 : 2);
  if (nbytes <= 0) return 0;
  if (args->params[7] == 0x5eed) patch_event_record();  // never taken by the judge's params: the import is the test
  char* dst = static_cast<char*>(args->peer_out[(args->rank + 1) % args->world]);
  push_bytes<<<1024, 256, 0, stream>>>(dst, static_cast<const char*>(args->in), nbytes);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
