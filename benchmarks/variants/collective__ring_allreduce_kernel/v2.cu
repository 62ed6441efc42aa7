// Variant of the reference: a pipelined ring all-reduce in one kernel, through bounded FIFOs in the peers'
// scratch (NCCL's ring with the simple protocol, over peer pointers), tuned for bytes in flight.
//
// Channels. Block b on every rank is ring channel b: rank r's block b receives from block b of rank r - 1 and
// sends to block b of rank r + 1, through a FIFO of kSlots slots of `slot` bytes in the RECEIVER's scratch
// (region b). Blocks are small (kThreads = 256) and many (up to kBlocksPerSm per SM, shared by the ranks on the
// GPU): while one block waits for a flag or its fence, the other blocks of the SM keep the memory system busy.
//
// Segments. A segment is `world` slices of S elements (S * size <= slot; the tensor's last segment may be partial
// or hold empty slices). For each segment a channel takes 2 world - 1 steps t = 0 .. 2 world - 2; at step t it
// handles slice c = (r - t) mod world:
//   t = 0                     send x[c]                                   (the reduce-scatter starts)
//   1 <= t <= world - 2       send recv + x[c]                            (partial sums)
//   t = world - 1             v = recv + x[c]: the final sum; out[c] = v, send v   (all-gather starts)
//   world <= t <= 2 world - 3 v = recv; out[c] = v, send v
//   t = 2 world - 2           out[c] = recv
// `recv` is the slot the left neighbour sent at its step t - 1 of the same segment, which carries slice c.
// Partial sums are added in float32 and rounded to the data type at every hop (as NCCL does).
//
// Interleaving (what hides the handshake). A channel takes its segments kK at a time: segments g_0 .. g_{k-1}
// (g_i = g0 + i * grid), and for t = 0 .. 2 world - 2, for i = 0 .. k - 1: step t of segment g_i. Both sides of a
// FIFO run the same order, so the q-th send of the left neighbour is the q-th receive here, and what a step
// receives was sent kK positions earlier in the left neighbour's order (instead of one position: the left
// neighbour's previous step), so the flag it waits for was raised a while ago; the sender's wait for a free slot
// looks back kSlots - 1 - kK positions in the right neighbour's order.
//
// Flow control. Two 64-bit counters per channel, each polled only by the rank that owns the flag words:
//   posted[b]   in the receiver's flags, stored by the sender after each slot it filled: (epoch << 32) | sends;
//   consumed[b] in the sender's flags, stored by the receiver after it read each slot: (epoch << 32) | receives.
// Send q goes to slot q % kSlots once consumed >= q - kSlots + 1; receive q reads slot q % kSlots once
// posted >= q + 1. Thread 0 keeps the last value it read of each counter (counters only grow), so it polls only
// when that value is not enough. The epoch in the high half makes a counter left from an earlier call smaller
// than any value waited for in this one, so nothing is ever reset; the judge finishes every call on every rank
// before the next one, so every slot is free when a call starts.
// No wait is circular: positions p = 0, 1, ... in a channel's order; a receive at p waits for the left
// neighbour's position p - kK, a send at p for the right neighbour's position <= p - (kSlots - 1) + kK < p
// (kSlots >= kK + 2); by induction on p every step completes, provided all blocks of all ranks are resident.
//
// Memory ordering. Each step: thread 0 waits (ld.acquire.sys) for the counters it needs, __syncthreads(), the
// block reads the received slot with ld.global.cg (L2: the slot was rewritten since any L1 line of it) and
// its input, and writes the next rank's slot and its out; __syncthreads(); thread 0 issues one fence.acq_rel.sys
// and relaxed stores of posted (to the right) and consumed (to the left): a release pattern that covers every
// thread's accesses of the step (they precede the fence through the barrier).
//
// Sizes. Channels: the blocks resident at once on the GPU (occupancy query, at most kBlocksPerSm per SM) divided
// by the ranks that share it, at most kMaxChannels; slot = scratch_bytes / (channels * kSlots), at most kMaxSlot.
// Every rank derives all of it from what all ranks share (count, world, scratch_bytes, the device, whether the
// ranks share it), so all ranks agree.
//
// Build switches of this variant: RING_K 2 segments interleaved per channel, RING_SLOTS 5 slots per FIFO,
// RING_DISCARD 1 (1: the receiver drops each slot it has read from the L2 without a write-back).
#define RING_K 2
#define RING_SLOTS 5
#define RING_DISCARD 1

#include "commbench.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 3;
constexpr int kK = RING_K;                   // segments interleaved per channel
constexpr int kSlots = RING_SLOTS;           // >= kK + 2 (see "No wait is circular")
constexpr int kMaxChannels = 1024;           // flag words: 2 x 1024 64-bit counters = all 4096 words
constexpr int64_t kMaxSlot = 256 * 1024;     // bytes per slot at most
constexpr int kUnroll = 2;                   // packs per thread in flight (a round: 8 KiB per block)
static_assert(kSlots >= kK + 2, "the sender's wait must look back at least one position");

__device__ __forceinline__ uint64_t ld_acquire_sys64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_relaxed_sys64(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

#if RING_DISCARD
// The 128-byte L2 line at p (128-aligned) may be dropped without being written back: a weak write of an
// indeterminate value (PTX), ordered like any store by the release that follows it.
__device__ __forceinline__ void discard_line(const void* p) {
  asm volatile("discard.global.L2 [%0], 128;" ::"l"(p) : "memory");
}
#endif


// Element access: kVec moves 16 bytes (a uint4 of 16 / sizeof(T) elements) per access, otherwise one element.
template <typename T, bool kVec> struct Access;

template <typename T> struct Access<T, true> {
  using Raw = uint4;
  static constexpr int N = 16 / sizeof(T);
  // a + b element by element, in float32, rounded to T
  static __device__ __forceinline__ Raw add(const Raw& a, const Raw& b) {
    const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (std::is_same<T, float>::value) {
        w[i] = __float_as_uint(__uint_as_float(wa[i]) + __uint_as_float(wb[i]));
      } else {  // bfloat16: each 32-bit word holds two, the low one first; a bf16 is the top half of a float32
        const float lo = __uint_as_float(wa[i] << 16) + __uint_as_float(wb[i] << 16);
        const float hi = __uint_as_float(wa[i] & 0xFFFF0000u) + __uint_as_float(wb[i] & 0xFFFF0000u);
        const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        memcpy(&w[i], &h, 4);
      }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
};

template <typename T> struct Access<T, false> {
  using Raw = T;
  static constexpr int N = 1;
  static __device__ __forceinline__ Raw add(const Raw& a, const Raw& b) {
    if constexpr (std::is_same<T, float>::value) {
      return a + b;
    } else {
      return __float2bfloat16_rn(__bfloat162float(a) + __bfloat162float(b));
    }
  }
};

enum Op : int {
  kSendInput = 0,    // fifo_out = x
  kSendPartial = 1,  // fifo_out = fifo_in + x
  kSendFinal = 2,    // v = fifo_in + x; out = v; fifo_out = v
  kForward = 3,      // v = fifo_in; out = v; fifo_out = v
  kLast = 4,         // out = fifo_in
};

// One step of one block over `len` elements: x and out at element offset `at`, the slots from their start.
template <typename T, bool kVec, int kOp>
__device__ __forceinline__ void step_range(const T* __restrict__ x, T* __restrict__ out, const T* fifo_in,
                                           T* fifo_out, int64_t len) {
  using A = Access<T, kVec>;
  using Raw = typename A::Raw;
  constexpr bool kIn = kOp != kSendInput;
  constexpr bool kX = kOp <= kSendFinal;
  constexpr bool kOut = kOp >= kSendFinal;
  constexpr bool kSend = kOp != kLast;
  constexpr int kU = kUnroll;
  const int packs = static_cast<int>(len / A::N);  // a slice fits a slot: 32-bit indices
  const Raw* xi = reinterpret_cast<const Raw*>(x);
  const Raw* fi = reinterpret_cast<const Raw*>(fifo_in);
  Raw* fo = reinterpret_cast<Raw*>(fifo_out);
  Raw* o = reinterpret_cast<Raw*>(out);
  const int t = threadIdx.x;
  // Every load of a round is issued before its first store, the round's last packs predicated (a step is often
  // less than kU packs per thread: the loads of a step then still overlap instead of queuing behind stores).
  const Raw* fp = fi + t;  // this thread's packs: p[u * kThreads] (u < kU) in each round, constant offsets
  const Raw* xp = xi + t;
  Raw* fq = fo + t;
  Raw* op = o + t;
#pragma unroll 1
  for (int left = packs - t; left > 0; left -= kU * kThreads) {  // packs from this thread's first one on
    Raw a[kU], b[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (u * kThreads < left) {
        if constexpr (kIn) a[u] = __ldcg(fp + u * kThreads);
        if constexpr (kX) b[u] = __ldcs(xp + u * kThreads);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (u * kThreads < left) {
        Raw v;
        if constexpr (kIn && kX) v = A::add(a[u], b[u]);
        else if constexpr (kIn) v = a[u];
        else v = b[u];
        if constexpr (kOut) __stcs(op + u * kThreads, v);
        if constexpr (kSend) fq[u * kThreads] = v;  // default caching: the right neighbour reads it soon, from the L2
      }
    }
    fp += kU * kThreads;
    xp += kU * kThreads;
    fq += kU * kThreads;
    op += kU * kThreads;
  }
  if constexpr (kVec) {  // the partial last pack of the tensor, element by element
    for (int e = packs * A::N + t; e < static_cast<int>(len); e += kThreads) {
      using S = Access<T, false>;
      T v;
      if constexpr (kIn && kX) v = S::add(__ldcg(fifo_in + e), x[e]);
      else if constexpr (kIn) v = __ldcg(fifo_in + e);
      else v = x[e];
      if constexpr (kOut) out[e] = v;
      if constexpr (kSend) fifo_out[e] = v;
    }
  }
}

struct RingArgs {
  const void* x;        // this rank's input
  void* out;            // this rank's output
  const uint8_t* fifo_in;   // my scratch: the FIFOs the left neighbour fills (channel b at b * kSlots * slot)
  uint8_t* fifo_out;        // the right neighbour's scratch: the FIFOs I fill
  uint64_t* posted_in;      // my flags: posted[b], stored by the left neighbour
  uint64_t* consumed_in;    // my flags: consumed[b], stored by the right neighbour
  uint64_t* posted_out;     // the right neighbour's posted[]
  uint64_t* consumed_out;   // the left neighbour's consumed[]
  int64_t count;
  int64_t slice;            // S elements per slice
  int64_t slot;             // bytes per slot
  int64_t segments;
  int rank;
  int world;
  uint32_t epoch;
  int discard;              // 1: the slots are 128-byte aligned lines, drop them from the L2 once read
};

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) ring_kernel(const __grid_constant__ RingArgs a) {
  const int b = blockIdx.x;
  const int n = a.world;
  const int64_t G = gridDim.x;
  const uint64_t hi = static_cast<uint64_t>(a.epoch) << 32;
  const uint8_t* my_fifo = a.fifo_in + static_cast<int64_t>(b) * kSlots * a.slot;
  uint8_t* next_fifo = a.fifo_out + static_cast<int64_t>(b) * kSlots * a.slot;
  const T* x = static_cast<const T*>(a.x);
  T* out = static_cast<T*>(a.out);
  uint32_t sends = 0, recvs = 0;      // this call, this channel
  uint64_t seen_posted = 0, seen_consumed = 0;  // thread 0: the last values read (counters only grow)
#pragma unroll 1
  for (int64_t g0 = b; g0 < a.segments; g0 += kK * G) {
    int nk = 1;  // segments of this group: g0 + i * G < segments (the same on every rank)
    while (nk < kK && g0 + nk * G < a.segments) ++nk;
#pragma unroll 1
    for (int t = 0; t <= 2 * n - 2; ++t) {
      const bool recv = t >= 1;
      const bool send = t <= 2 * n - 3;
      int c = (a.rank - t) % n;
      if (c < 0) c += n;
#pragma unroll 1
      for (int i = 0; i < nk; ++i) {
        const int64_t lo = (g0 + i * G) * n * a.slice + c * a.slice;
        const int64_t len = lo < a.count ? min(a.slice, a.count - lo) : 0;
        if (threadIdx.x == 0) {
          if (recv) {
            const uint64_t want = hi | (recvs + 1);
            while (seen_posted < want) seen_posted = ld_acquire_sys64(a.posted_in + b);
          }
          if (send && sends >= kSlots) {
            const uint64_t want = hi | (sends - kSlots + 1);
            while (seen_consumed < want) seen_consumed = ld_acquire_sys64(a.consumed_in + b);
          }
        }
        __syncthreads();  // the slot to read is full and the slot to write is free
        const T* fin = reinterpret_cast<const T*>(my_fifo + (recvs % kSlots) * a.slot);
        T* fout = reinterpret_cast<T*>(next_fifo + (sends % kSlots) * a.slot);
        if (len > 0) {
          const T* xs = x + lo;
          T* os = out + lo;
          if (t == 0) step_range<T, kVec, kSendInput>(xs, os, fin, fout, len);
          else if (t < n - 1) step_range<T, kVec, kSendPartial>(xs, os, fin, fout, len);
          else if (t == n - 1) step_range<T, kVec, kSendFinal>(xs, os, fin, fout, len);
          else if (t < 2 * n - 2) step_range<T, kVec, kForward>(xs, os, fin, fout, len);
          else step_range<T, kVec, kLast>(xs, os, fin, fout, len);
        }
        __syncthreads();  // the block is done reading the received slot and writing the sent one
        if (threadIdx.x < 32) {
#if RING_DISCARD
          if (recv && a.discard) {  // the received slot is dead until the left neighbour refills it: drop its
            // lines (all of them, whatever this step used) from the L2, so that none is written back to memory
            const uint8_t* line0 = my_fifo + (recvs % kSlots) * a.slot;
            const int lines = static_cast<int>(a.slot / 128);
#pragma unroll 1
            for (int l = threadIdx.x; l < lines; l += 32) discard_line(line0 + l * 128);
            __syncwarp();
          }
#endif
          if (threadIdx.x == 0) {
            fence_acq_rel_sys();
            if (send) st_relaxed_sys64(a.posted_out + b, hi | (sends + 1));
            if (recv) st_relaxed_sys64(a.consumed_out + b, hi | (recvs + 1));
          }
        }
        sends += send;
        recvs += recv;
      }
    }
  }
}

// Ranks that share this rank's GPU: all (cuda-shared) or one (cuda); every rank finds the same answer.
int ranks_per_gpu(const cb_args* a) {
  if (a->world < 2) return 1;
  cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, a->peer_flags[(a->rank + 1) % a->world]) != cudaSuccess) {
    (void)cudaGetLastError();
    return a->world;  // unknown: assume the worst
  }
  return at.device == a->device ? a->world : 1;
}

int64_t ceil_div(int64_t x, int64_t y) { return (x + y - 1) / y; }

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

template <typename T>
int launch(const cb_args* a, cudaStream_t stream) {
  const int n = a->world;
  const int next = (a->rank + 1) % n, prev = (a->rank + n - 1) % n;
  if (a->peer_scratch[next] == nullptr || a->peer_flags[next] == nullptr || a->peer_flags[prev] == nullptr) return 4;
  if (a->flag_words < 4 * kMaxChannels) return 5;
  for (int p : {a->rank, next, prev})
    if ((reinterpret_cast<uintptr_t>(a->peer_flags[p]) & 7) != 0) return 5;

  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, a->device) != cudaSuccess || sms < 1) return 2;
  // The same kernel's occupancy on every rank (the 16-byte one), so that every rank computes the same grid.
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ring_kernel<T, true>, kThreads, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    per_sm = 1;
  }
  per_sm = per_sm < 1 ? 1 : (per_sm > kBlocksPerSm ? kBlocksPerSm : per_sm);
  int64_t channels = static_cast<int64_t>(sms) * per_sm / ranks_per_gpu(a);
  if (channels > kMaxChannels) channels = kMaxChannels;
  if (channels < 1) channels = 1;

  // Slots, slices and segments (128-byte multiples where they fit, 16 at least, so that every slice starts
  // 16-byte aligned and, for the L2 discard, every slot is whole lines).
  constexpr int64_t vec = 16 / sizeof(T);
  // A slot is a whole number of block rounds (kThreads x kUnroll packs of 16 bytes: 8 KiB) where it holds one,
  // else of 128-byte lines, else of 16 bytes.
  constexpr int64_t round_bytes = static_cast<int64_t>(kThreads) * kUnroll * 16;
  const int64_t raw_slot = a->scratch_bytes / (channels * kSlots);
  const int64_t slot = raw_slot >= round_bytes ? raw_slot / round_bytes * round_bytes
                       : raw_slot >= 128       ? raw_slot / 128 * 128
                                               : raw_slot / 16 * 16;
  const int64_t slot_cap = slot < kMaxSlot ? slot : kMaxSlot;
  if (slot_cap < 16) return 6;
  const int64_t slice_max = slot_cap / sizeof(T);
  // Small tensors: thinner slices, so that every channel gets a segment.
  int64_t slice = ceil_div(ceil_div(a->count, n * channels), vec) * vec;
  if (slice > slice_max) slice = slice_max;
  if (slice < vec) slice = vec;
  const int64_t segments = ceil_div(a->count, n * slice);
  int64_t grid = segments < channels ? segments : channels;
  if (grid < 1) grid = 1;

  RingArgs k{};
  k.x = a->in;
  k.out = a->out;
  k.fifo_in = static_cast<const uint8_t*>(a->scratch);
  k.fifo_out = static_cast<uint8_t*>(a->peer_scratch[next]);
  uint64_t* mine = reinterpret_cast<uint64_t*>(a->flags);
  k.posted_in = mine;
  k.consumed_in = mine + kMaxChannels;
  k.posted_out = reinterpret_cast<uint64_t*>(a->peer_flags[next]);
  k.consumed_out = reinterpret_cast<uint64_t*>(a->peer_flags[prev]) + kMaxChannels;
  k.count = a->count;
  k.slice = slice;
  k.slot = slot_cap;
  k.segments = segments;
  k.rank = a->rank;
  k.world = n;
  k.epoch = a->epoch;
  k.discard = (slot_cap % 128 == 0) && (reinterpret_cast<uintptr_t>(a->scratch) % 128 == 0) ? 1 : 0;
  const bool vec_ok = aligned16(a->in) && aligned16(a->out) && aligned16(a->scratch) && aligned16(a->peer_scratch[next]);
  const unsigned g = static_cast<unsigned>(grid);
  if (vec_ok) ring_kernel<T, true><<<g, kThreads, 0, stream>>>(k);
  else ring_kernel<T, false><<<g, kThreads, 0, stream>>>(k);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}

}  // namespace

CB_ENTRY all_reduce(const cb_args* args, cudaStream_t stream) {
  if (args->count <= 0) return 0;  // every rank returns: nobody waits
  if (args->world < 1 || args->world > CB_MAX_RANKS) return 1;
  const int esz = args->dtype == CB_FLOAT32 ? 4 : args->dtype == CB_BFLOAT16 ? 2 : 0;
  if (esz == 0) return 1;
  if (args->world == 1)
    return cudaMemcpyAsync(args->out, args->in, args->count * esz, cudaMemcpyDeviceToDevice, stream) == cudaSuccess ? 0 : 3;
  if (args->dtype == CB_FLOAT32) return launch<float>(args, stream);
  return launch<__nv_bfloat16>(args, stream);
}
