// Reference: ring shift streamed through a small ring buffer in the receiver's scratch, with credits.
//
// The input is cut into chunks of kChunk bytes; chunk q belongs to channel q % C. A channel is a pair of warps:
// a producer warp on the sender and a consumer warp on the receiver (its right neighbour), which share kSlots
// slots of kChunk bytes in the receiver's scratch (channel c's slots at [c * kSlots * kChunk, ...)). The m-th
// chunk of a channel goes to slot m % kSlots:
//   producer: wait for credit >= m - kSlots + 1 (the consumer has emptied that slot), copy the chunk from `in`
//             into the slot (16-byte loads, all in flight, then 16-byte remote stores), __syncwarp, and lane 0
//             publishes ready = m + 1 with a release store (st.release.sys) into the receiver's flags;
//   consumer: wait for ready >= m + 1 (acquire loads by lane 0, __syncwarp), copy the slot into `out` (L2-only
//             loads: the slot is rewritten by the peer, so never from the L1), __syncwarp, and lane 0 returns the
//             slot with a release store credit = m + 1 into the sender's flags (the release orders the slot's
//             reads before the producer's next writes into it).
// Each counter has one writer and only grows within a call. Its value is tagged with the epoch, (epoch << 32) |
// count, as a 64-bit word: a counter left from an earlier call (smaller epoch) or zeroed is below every value of
// this call, so nothing is reset. The producer does not wait for the last kSlots credits; they land before the
// kernel ends, and the judge synchronises every device between calls.
//
// A block is 4 producer warps and 4 consumer warps (channels 4b .. 4b + 3): both directions of a rank stream at
// once, and a warp that waits on a flag stalls only its own channel. The ring's size bounds the bytes in flight:
// C * kSlots * kChunk <= scratch_bytes (4 MiB: 128 channels of 4 slots of 8 KiB). The number of channels
// depends only on the size, the scratch and the device, so every rank computes the same C and slot layout.
//
// Deadlock: producer c of rank r waits only for consumer c of rank r + 1, which waits only for producer c of rank
// r for an earlier chunk; no cycle, provided that every block of every rank sharing a GPU is resident at once,
// so the grid is capped at the blocks that fit (occupancy query, capped) divided by the ranks sharing the GPU.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kChannelsPerBlock = 4;               // warps 0..3 produce, warps 4..7 consume
constexpr int kVecPerLane = 16;                    // 16-byte words per lane per chunk
constexpr int64_t kChunk = 32 * 16 * kVecPerLane;  // 8 KiB
constexpr int kSlots = 4;
constexpr int kMaxChannels = 1024;                 // flags: ready[c] at u64 c, credit[c] at u64 kMaxChannels + c
constexpr int kMaxBlocksPerSm = 4;

int64_t dtype_bytes(int dtype) {
  switch (dtype) {
    case CB_FLOAT64: case CB_INT64: return 8;
    case CB_FLOAT32: case CB_INT32: return 4;
    case CB_FLOAT16: case CB_BFLOAT16: return 2;
    case CB_UINT8: return 1;
    default: return 0;
  }
}

struct Args {
  const unsigned char* in;
  unsigned char* out;
  unsigned char* send_slots;             // the right neighbour's scratch: where this rank produces
  const unsigned char* recv_slots;       // this rank's scratch: where it consumes
  unsigned long long* send_ready;        // ready[] in the right neighbour's flags (this rank writes)
  const unsigned long long* recv_ready;  // ready[] in this rank's flags (the left neighbour writes)
  unsigned long long* send_credit;       // credit[] in the left neighbour's flags (this rank's consumers write)
  const unsigned long long* recv_credit; // credit[] in this rank's flags (the right neighbour's consumers write)
  int64_t nbytes;
  int64_t nchunks;
  int channels;
  unsigned long long tag;                // epoch << 32
};

__device__ __forceinline__ unsigned long long ld_acquire_sys(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Copies chunk bytes [0, len) from src to dst, one warp; `from_peer`: src is written by another rank's kernel in
// this call, so it is read from the L2 (ld.global.cg), never through the L1.
template <bool kFromPeer, bool kStreamOut>
__device__ __forceinline__ void copy_chunk(unsigned char* dst, const unsigned char* src, int len, int lane) {
  const int nvec = len / 16;  // len <= kChunk: 32-bit indices
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* d = reinterpret_cast<uint4*>(dst);
  uint4 v[kVecPerLane];
#pragma unroll
  for (int u = 0; u < kVecPerLane; ++u) {
    const int i = lane + 32 * u;
    if (i < nvec) v[u] = kFromPeer ? __ldcg(s + i) : __ldcs(s + i);
  }
#pragma unroll
  for (int u = 0; u < kVecPerLane; ++u) {
    const int i = lane + 32 * u;
    if (i < nvec) {
      if (kStreamOut) __stcs(d + i, v[u]);
      else d[i] = v[u];
    }
  }
  const int rest = len - nvec * 16;  // < 16 bytes, only in the last chunk
  if (lane < rest) {
    const int o = nvec * 16 + lane;
    dst[o] = kFromPeer ? *reinterpret_cast<const volatile unsigned char*>(src + o) : src[o];
  }
}

__global__ void __launch_bounds__(kThreads, 2) credit_ring_kernel(const __grid_constant__ Args a) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const bool producer = warp < kChannelsPerBlock;
  const int c = blockIdx.x * kChannelsPerBlock + (warp % kChannelsPerBlock);
  if (c >= a.channels || c >= a.nchunks) return;  // warp-uniform
  const int64_t n = (a.nchunks - c + a.channels - 1) / a.channels;  // chunks of this channel
  const int64_t slots = static_cast<int64_t>(c) * kSlots;
  unsigned long long seen = 0;  // lane 0: the last counter value it read
  if (producer) {
    for (int64_t m = 0; m < n; ++m) {
      if (m >= kSlots) {
        if (lane == 0) {
          const unsigned long long need = a.tag | static_cast<unsigned long long>(m - kSlots + 1);
          while (seen < need) seen = ld_acquire_sys(a.recv_credit + c);
        }
        __syncwarp();
      }
      const int64_t q = c + m * a.channels;
      const int64_t off = q * kChunk;
      const int len = static_cast<int>(a.nbytes - off < kChunk ? a.nbytes - off : kChunk);
      copy_chunk<false, false>(a.send_slots + (slots + m % kSlots) * kChunk, a.in + off, len, lane);
      __syncwarp();
      if (lane == 0) st_release_sys(a.send_ready + c, a.tag | static_cast<unsigned long long>(m + 1));
    }
  } else {
    for (int64_t m = 0; m < n; ++m) {
      if (lane == 0) {
        const unsigned long long need = a.tag | static_cast<unsigned long long>(m + 1);
        while (seen < need) seen = ld_acquire_sys(a.recv_ready + c);
      }
      __syncwarp();
      const int64_t q = c + m * a.channels;
      const int64_t off = q * kChunk;
      const int len = static_cast<int>(a.nbytes - off < kChunk ? a.nbytes - off : kChunk);
      copy_chunk<true, true>(a.out + off, a.recv_slots + (slots + m % kSlots) * kChunk, len, lane);
      __syncwarp();
      if (lane == 0) st_release_sys(a.send_credit + c, a.tag | static_cast<unsigned long long>(m + 1));
    }
  }
}

// Ranks that share this rank's GPU. The judge puts either every rank on one GPU (cuda-shared) or one rank on
// each GPU (cuda), so the right neighbour tells which; every rank computes the same answer.
int ranks_per_gpu(const cb_args* a) {
  if (a->world < 2) return 1;
  cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, a->peer_flags[(a->rank + 1) % a->world]) != cudaSuccess) {
    (void)cudaGetLastError();
    return a->world;  // unknown: assume the worst
  }
  return at.device == a->device ? a->world : 1;
}

}  // namespace

CB_ENTRY ring_shift(const cb_args* args, cudaStream_t stream) {
  const int64_t esz = dtype_bytes(args->dtype);
  if (esz == 0) return 1;
  if (args->world < 1 || args->world > CB_MAX_RANKS) return 1;
  const int64_t nbytes = args->count * esz;
  if (nbytes <= 0) return 0;  // every rank has the same count: nobody waits
  if (args->flag_words < 4 * kMaxChannels) return 4;
  const int right = (args->rank + 1) % args->world;
  const int left = (args->rank - 1 + args->world) % args->world;
  Args k{};
  k.in = static_cast<const unsigned char*>(args->in);
  k.out = static_cast<unsigned char*>(args->out);
  k.send_slots = static_cast<unsigned char*>(args->peer_scratch[right]);
  k.recv_slots = static_cast<const unsigned char*>(args->scratch);
  k.send_ready = reinterpret_cast<unsigned long long*>(args->peer_flags[right]);
  k.recv_ready = reinterpret_cast<const unsigned long long*>(args->flags);
  k.send_credit = reinterpret_cast<unsigned long long*>(args->peer_flags[left]) + kMaxChannels;
  k.recv_credit = reinterpret_cast<const unsigned long long*>(args->flags) + kMaxChannels;
  k.nbytes = nbytes;
  k.nchunks = (nbytes + kChunk - 1) / kChunk;
  k.tag = static_cast<unsigned long long>(args->epoch) << 32;

  int sms = 0, per_sm = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, credit_ring_kernel, kThreads, 0) != cudaSuccess) return 2;
  if (per_sm > kMaxBlocksPerSm) per_sm = kMaxBlocksPerSm;
  if (per_sm < 1) per_sm = 1;
  const int64_t resident = static_cast<int64_t>(sms) * per_sm / ranks_per_gpu(args);
  int64_t channels = args->scratch_bytes / (kSlots * kChunk);  // the ring must fit the (equal) scratch
  if (channels > kMaxChannels) channels = kMaxChannels;
  if (channels > resident * kChannelsPerBlock) channels = resident * kChannelsPerBlock;
  if (channels > k.nchunks) channels = k.nchunks;
  if (channels < 1) return 5;  // scratch smaller than one channel's slots
  k.channels = static_cast<int>(channels);
  const int64_t grid = (channels + kChannelsPerBlock - 1) / kChannelsPerBlock;
  credit_ring_kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(k);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
