// CommBench-Env: linked into every `cuda` candidate library, never compiled alone.
//
// Every stream a candidate creates is a blocking stream, whatever flags it asks for. The judge times a call
// between marks that order all blocking streams (work on the legacy default stream waits for them, and they
// wait for it): before the call, the legacy stream waits for the judge's start gate; after it, an event on the
// legacy stream marks the end of everything the call queued. A non-blocking side stream would escape both and
// could run while the gate still holds the clock (benchmarks/results/gpu_stream_checks-2026-11-30-2gpu.md: a
// 1 MiB push read 3 us against the reference's 9 us). The definitions are hidden, so the candidate's own calls
// bind to them at link time and nothing else in the process sees them; stream priorities are not kept.
#include <cuda_runtime_api.h>

#define CB_LOCAL extern "C" __attribute__((visibility("hidden")))

CB_LOCAL cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  return cudaStreamCreate(stream);
}

CB_LOCAL cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int, int) {
  return cudaStreamCreate(stream);
}
