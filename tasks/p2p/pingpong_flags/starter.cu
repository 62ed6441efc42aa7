#include "commbench.h"

#include <stdint.h>

// TODO: bounce the ball `rounds` times between this rank and its partner (rank ^ 1); the even rank pings first.
//   pinger, round k: ball += keys[k]; send the ball; wait for the reply; out[k] = reply; ball = reply.
//   ponger, round k: wait for the ball; out[k] = ball; ball += keys[k]; send the ball back.
// Send = store into the partner's flags (`outbox`); receive = poll your own flags (`inbox`) until the value of
// this round arrives. Build the values you wait for from `epoch` so that old values from earlier calls never match.
__global__ void pingpong_kernel(const uint32_t* keys, uint32_t* out, int rounds, bool pinger, uint32_t* inbox,
                                uint32_t* outbox, uint32_t epoch) {
  // TODO
}

CB_ENTRY pingpong(const cb_args* args, cudaStream_t stream) {
  const int partner = args->rank ^ 1;
  pingpong_kernel<<<1, 32, 0, stream>>>(static_cast<const uint32_t*>(args->in), static_cast<uint32_t*>(args->out),
                                        static_cast<int>(args->count), (args->rank & 1) == 0, args->flags,
                                        args->peer_flags[partner], args->epoch);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
