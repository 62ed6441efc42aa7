// CommBench-Env: the calling convention of `cuda` tasks. The judge owns every buffer; candidates only launch work.
//
// Every entry point a task card names has this signature:
//
//     extern "C" int NAME(const cb_args* args, cudaStream_t stream);
//
// It must enqueue its work on `stream` (or on streams that it joins back to `stream`) and return 0; any other
// value is reported as an error. Streams it creates are blocking streams, whatever flags it asks for (the judge
// links its own cudaStreamCreateWithFlags/WithPriority into the library; priorities are not kept), and the clock
// stops when the work of every stream it used has finished. It cannot allocate device memory or synchronise the
// device: the build's import check refuses cudaMalloc*, cudaFree, cudaDeviceSynchronize and the other blocking
// calls. State kept between calls outside the buffers below is not reliable (the judge may run calls in any
// order, in fresh processes each evaluation). All ranks of an evaluation run in one process, each rank from its own host
// thread with its own stream; on several GPUs, rank r runs on GPU r with peer access enabled between them, so
// the peer pointers below can be read and written directly from kernels.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#define CB_MAX_RANKS 8
#define CB_MAX_PARAMS 8
#define CB_MAX_AUX 4

enum cb_dtype { CB_FLOAT32 = 0, CB_FLOAT16 = 1, CB_BFLOAT16 = 2, CB_FLOAT64 = 3, CB_INT32 = 4, CB_INT64 = 5, CB_UINT8 = 6 };

typedef struct cb_args {
  int32_t rank;          // this rank, 0 .. world-1
  int32_t world;         // number of ranks
  int32_t dtype;         // cb_dtype of `in` and `out`
  int32_t device;        // CUDA device of this rank
  int64_t count;         // elements of `in` (the task's prompt says what they mean)
  int64_t out_count;     // elements of `out`
  const void* in;        // this rank's input (device memory, read-only)
  void* out;             // this rank's output (device memory; filled with NaN / 0xFF bytes before each call)
  void* scratch;         // this rank's scratch buffer (device memory, zeroed once before the first call)
  int64_t scratch_bytes;
  uint32_t* flags;       // this rank's signal words (device memory, zeroed once before the first call)
  int64_t flag_words;
  uint32_t epoch;        // >= 1, the same on every rank of a call, one more than the previous call's: it keeps
                        // counting across cases, while scratch and flags are zeroed afresh for each check
                        // case and kept across the calls of a benchmark (flag protocols need no resets)
  int32_t reserved;
  // Peer pointers: entry p is rank p's buffer. A task may keep some buffers private (its rules say which):
  // then entry p of that array is NULL for every p != rank. Entry `rank` is always this rank's own buffer.
  const void* peer_in[CB_MAX_RANKS];      // every rank's `in` (peer_in[rank] == in)
  void* peer_out[CB_MAX_RANKS];           // every rank's `out`
  void* peer_scratch[CB_MAX_RANKS];       // every rank's `scratch`
  uint32_t* peer_flags[CB_MAX_RANKS];     // every rank's `flags`
  int64_t params[CB_MAX_PARAMS];          // task-specific integers (see the prompt)
  const void* aux_in[CB_MAX_AUX];         // task-specific extra inputs (device memory, read-only)
  int64_t aux_in_count[CB_MAX_AUX];
  void* aux_out[CB_MAX_AUX];              // task-specific extra outputs (device memory)
  int64_t aux_out_count[CB_MAX_AUX];
} cb_args;

#define CB_ENTRY extern "C" __attribute__((visibility("default"))) int
