// TASK: p2p/ipc_push_copy
// EXPECT: forbidden_symbol dl_iterate_phdr
// No dlopen, no dlsym and no ncclAllReduce in the import table: the library walks the loaded objects with
// dl_iterate_phdr, reads each one's dynamic symbol table itself and picks up any function by name (here the
// driver's cuStreamCreate, which makes a stream the judge's marks do not order, and NCCL's all-reduce if the
// process has it). The blocklist never saw those names, only dl_iterate_phdr; the allowlist refuses that.
#include "commbench.h"

#include <cuda_runtime.h>
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <string.h>

namespace {

struct Lookup {
  const char* name;
  void* found;
};

// The symbol `want` of one loaded object, through its DT_SYMTAB/DT_STRTAB and DT_HASH (chain count = symbols).
int find_in_object(struct dl_phdr_info* info, size_t, void* data) {
  Lookup* want = static_cast<Lookup*>(data);
  const ElfW(Dyn)* dyn = nullptr;
  for (int i = 0; i < info->dlpi_phnum; ++i)
    if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
      dyn = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
  if (!dyn) return 0;
  const ElfW(Sym)* symtab = nullptr;
  const char* strtab = nullptr;
  const uint32_t* hash = nullptr;
  for (; dyn->d_tag != DT_NULL; ++dyn) {
    if (dyn->d_tag == DT_SYMTAB) symtab = reinterpret_cast<const ElfW(Sym)*>(dyn->d_un.d_ptr);
    if (dyn->d_tag == DT_STRTAB) strtab = reinterpret_cast<const char*>(dyn->d_un.d_ptr);
    if (dyn->d_tag == DT_HASH) hash = reinterpret_cast<const uint32_t*>(dyn->d_un.d_ptr);
  }
  if (!symtab || !strtab || !hash) return 0;
  for (uint32_t i = 0; i < hash[1]; ++i)
    if (symtab[i].st_value && strcmp(strtab + symtab[i].st_name, want->name) == 0) {
      want->found = reinterpret_cast<void*>(info->dlpi_addr + symtab[i].st_value);
      return 1;
    }
  return 0;
}

void* lookup(const char* name) {
  Lookup want{name, nullptr};
  dl_iterate_phdr(find_in_object, &want);
  return want.found;
}

__global__ void push_bytes(char* dst, const char* src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

}  // namespace

CB_ENTRY ring_shift(const cb_args* args, cudaStream_t stream) {
  const int64_t nbytes = args->count * (args->dtype == CB_FLOAT32 ? 4 : 2);
  if (nbytes <= 0) return 0;
  using StreamCreate = int (*)(cudaStream_t*, unsigned int);
  static StreamCreate create = reinterpret_cast<StreamCreate>(lookup("cuStreamCreate"));
  static void* nccl = lookup("ncclAllReduce");
  (void)nccl;
  cudaStream_t side = stream;
  if (create) create(&side, 1 /* CU_STREAM_NON_BLOCKING */);
  char* dst = static_cast<char*>(args->peer_out[(args->rank + 1) % args->world]);
  push_bytes<<<1024, 256, 0, side>>>(dst, static_cast<const char*>(args->in), nbytes);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
