// TASK: p2p/ipc_push_copy
// EXPECT: forbidden_symbol __cudaGetProcAddress cudaGetExportTable
// The blocklist kept the driver API out by its `cu[A-Z]` names and cudaGetDriverEntryPoint, but the runtime has
// other doors: __cudaGetProcAddress (an internal of libcudart, in the `__cuda` namespace that nvcc's registration
// stubs also use, so a `__cuda*` prefix would have let it in) hands out entry points by name, and
// cudaGetExportTable hands out the driver's private function tables. The allowlist names the registration
// stubs one by one and allows neither.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" cudaError_t __cudaGetProcAddress(const char* symbol, void** fn, int version, unsigned long long flags,
                                            void* status);
extern "C" cudaError_t cudaGetExportTable(const void** table, const cudaUUID_t* id);

__global__ void push_bytes(char* dst, const char* src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

CB_ENTRY ring_shift(const cb_args* args, cudaStream_t stream) {
  const int64_t nbytes = args->count * (args->dtype == CB_FLOAT32 ? 4 : 2);
  if (nbytes <= 0) return 0;
  cudaStream_t side = stream;
  void* fn = nullptr;
  if (__cudaGetProcAddress("cuStreamCreate", &fn, 12000, 0, nullptr) == cudaSuccess && fn)
    reinterpret_cast<int (*)(cudaStream_t*, unsigned int)>(fn)(&side, 1 /* CU_STREAM_NON_BLOCKING */);
  const void* table = nullptr;
  cudaUUID_t id = {};
  cudaGetExportTable(&table, &id);
  char* dst = static_cast<char*>(args->peer_out[(args->rank + 1) % args->world]);
  push_bytes<<<1024, 256, 0, side>>>(dst, static_cast<const char*>(args->in), nbytes);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
