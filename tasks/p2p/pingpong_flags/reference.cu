// Reference: ping-pong of a 32-bit ball between ranks 2i and 2i+1, one GPU thread on each side.
//
// A message is ONE aligned 64-bit word, {ball in the low half, sequence number in the high half}, stored into the
// partner's flag words with a single st.relaxed.sys.global.u64. An aligned 64-bit access is single-copy atomic in
// the PTX memory model, so the partner, polling its own flag words with ld.relaxed.sys.global.u64, sees either
// the old word or the whole new one: the ball needs no flag of its own and no fence. (A ball stored apart from
// its flag would need st.release.sys on the flag, i.e. a system-scope fence that waits for the ball's write to
// be acknowledged across NVLink, on the critical path of every round.)
//
// Sequence numbers are (epoch << 16) + round + 1: never 0 (flags start zeroed), and never a value of an earlier
// call (epoch grows by one per call, rounds <= 65535), so nothing is reset between calls. Only one message per
// direction is ever in flight: the pinger sends round k+1 only after the reply to round k, and the ponger replies
// to round k only after receiving it, so a message is never overwritten before it was read.
//
// Each rank runs one block of one warp (thread 0 works): the two kernels of a pair spin on each other, and one
// block per rank is always resident, whatever order the ranks' kernels start in and however many share a GPU.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kMaxRounds = 65535;

__device__ __forceinline__ uint64_t ld_relaxed_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_relaxed_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Spins until the inbox holds the message with sequence number `seq`; returns its ball.
__device__ __forceinline__ uint32_t receive(const uint64_t* inbox, uint32_t seq) {
  uint64_t m;
  do {
    m = ld_relaxed_sys(inbox);
  } while (static_cast<uint32_t>(m >> 32) != seq);
  return static_cast<uint32_t>(m);
}

__device__ __forceinline__ void send(uint64_t* outbox, uint32_t seq, uint32_t ball) {
  st_relaxed_sys(outbox, (static_cast<uint64_t>(seq) << 32) | ball);
}

__global__ void __launch_bounds__(32) pingpong_kernel(const uint32_t* __restrict__ keys, uint32_t* __restrict__ out,
                                                      int rounds, bool pinger, const uint64_t* inbox,
                                                      uint64_t* outbox, uint32_t epoch) {
  if (threadIdx.x != 0) return;
  const uint32_t base = epoch << 16;
  uint32_t key = keys[0];
  uint32_t ball = 0;
  for (int k = 0; k < rounds; ++k) {
    const uint32_t seq = base + static_cast<uint32_t>(k) + 1u;
    const uint32_t next_key = k + 1 < rounds ? keys[k + 1] : 0u;  // in flight while the ball is away
    if (pinger) {
      send(outbox, seq, ball + key);
      ball = receive(inbox, seq);
      out[k] = ball;
    } else {
      ball = receive(inbox, seq);
      send(outbox, seq, ball + key);  // reply first: the store to `out` is off the critical path
      out[k] = ball;
    }
    key = next_key;
  }
}

}  // namespace

CB_ENTRY pingpong(const cb_args* args, cudaStream_t stream) {
  if (args->world < 2 || args->world % 2 != 0) return 1;  // ranks pair up
  if (args->dtype != CB_INT32) return 2;
  if (args->count <= 0) return 0;  // both ranks of every pair see the same count: nobody waits
  if (args->count > kMaxRounds) return 3;
  if (args->flag_words < 2) return 4;
  const int partner = args->rank ^ 1;
  const uint64_t* inbox = reinterpret_cast<const uint64_t*>(args->flags);
  uint64_t* outbox = reinterpret_cast<uint64_t*>(args->peer_flags[partner]);
  if (((reinterpret_cast<uintptr_t>(inbox) | reinterpret_cast<uintptr_t>(outbox)) & 7) != 0) return 5;
  pingpong_kernel<<<1, 32, 0, stream>>>(static_cast<const uint32_t*>(args->in), static_cast<uint32_t*>(args->out),
                                        static_cast<int>(args->count), (args->rank & 1) == 0, inbox, outbox,
                                        args->epoch);
  return cudaGetLastError() == cudaSuccess ? 0 : 6;
}
