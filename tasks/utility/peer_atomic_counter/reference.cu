// Reference: records appended to the receivers' buffers, slots claimed with system-scope fetch-and-add on a counter
// in each receiver's memory, one remote atomic per (tile of 2048 records, destination).
//
// One kernel per rank; blocks never wait for anything, so no grid residency is needed and no deadlock is possible.
// Per tile of kTile records (grid-stride over tiles):
//   1. every thread loads kPerThread records (16-byte loads, consecutive threads on consecutive records) and their
//      destinations, and claims a slot for each in a per-block shared-memory counter of its destination. The claim
//      is warp-aggregated: __match_any_sync groups the lanes with the same destination, the group's first lane adds
//      the group's size with one shared atomic, and every lane's slot is that base plus the number of group lanes
//      below it. (A shared atomic per record would serialise up to 32 lanes on the same counter.)
//   2. __syncthreads(); thread q (q < world) claims the block's s_count[q] rows in rank q's `out` with ONE
//      atomicAdd_system on rank q's counter (a word of its scratch), which returns the first row of the range.
//   3. __syncthreads(); every thread stores its records at row base[q] + slot, straight into rank q's `out`.
// The rows a block claims are contiguous per destination, so the stores of a tile are mostly full lines.
//
// Counters without resets and without a handshake: call e claims on counter word (e & 1) of every receiver. Each
// rank zeroes its OWN word ((e + 1) & 1) during call e: nobody touches that word during call e (all ranks use
// e & 1), and call e + 1, which counts on it, starts only after call e has finished on every GPU. The first call
// of a series finds both words zero (scratch is zeroed before a series). A rank with no records still launches one
// block, so that its word for the next call is zeroed.
//
// Ordering: slots are disjoint by the atomics alone; the records need no flag, since `out` is read only after
// every GPU has finished. In `cuda` mode the atomics go to the receiver's memory over NVLink: system scope, so
// that the additions of all GPUs to one counter are atomic with respect to each other.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 512;
constexpr int kPerThread = 4;
constexpr int kTile = kThreads * kPerThread;  // records per tile: one remote atomic per destination per tile
constexpr int kBlocksPerSm = 4;               // 512 threads: up to 4 blocks per SM by threads

struct AppendArgs {
  const uint4* x;                  // this rank's records, one uint4 each
  const int32_t* dest;             // their destinations (-1: dropped)
  int64_t n;                       // records
  uint4* out[CB_MAX_RANKS];        // every rank's `out`, one uint4 per row
  uint32_t* counter[CB_MAX_RANKS];  // every rank's two counter words (the first 8 bytes of its scratch)
  int world;
  int rank;
  uint32_t epoch;
};

__global__ void __launch_bounds__(kThreads) append_kernel(const __grid_constant__ AppendArgs a) {
  __shared__ uint32_t s_count[CB_MAX_RANKS];  // this tile's records per destination
  __shared__ uint32_t s_base[CB_MAX_RANKS];   // the first row this block claimed at each destination
  const int t = threadIdx.x;
  const int lane = t & 31;
  const uint32_t lanes_below = (1u << lane) - 1u;
  const uint32_t cur = a.epoch & 1u;
  if (blockIdx.x == 0 && t == 0) a.counter[a.rank][cur ^ 1u] = 0;  // this rank's counter for the next call

  for (int64_t tile = static_cast<int64_t>(blockIdx.x) * kTile; tile < a.n;
       tile += static_cast<int64_t>(gridDim.x) * kTile) {
    if (t < CB_MAX_RANKS) s_count[t] = 0;
    __syncthreads();

    int d[kPerThread];
    uint32_t slot[kPerThread];
    uint4 rec[kPerThread];
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {  // all loads first: kPerThread records in flight per thread
      const int64_t i = tile + static_cast<int64_t>(k) * kThreads + t;
      d[k] = -1;
      if (i < a.n) {
        const int v = __ldg(a.dest + i);
        if (v >= 0 && v < a.world) {
          d[k] = v;
          rec[k] = __ldcs(a.x + i);  // read once: evict first
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      // every lane of the warp gets here (the loops are uniform): a full-mask match is safe
      const uint32_t group = __match_any_sync(0xffffffffu, d[k]);
      slot[k] = 0;
      if (d[k] >= 0) {
        const int leader = __ffs(group) - 1;
        uint32_t base = 0;
        if (lane == leader) base = atomicAdd(&s_count[d[k]], static_cast<uint32_t>(__popc(group)));
        base = __shfl_sync(group, base, leader);  // every lane of `group` is in this branch
        slot[k] = base + static_cast<uint32_t>(__popc(group & lanes_below));
      }
    }
    __syncthreads();
    if (t < a.world) {
      const uint32_t c = s_count[t];
      s_base[t] = c ? atomicAdd_system(a.counter[t] + cur, c) : 0u;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kPerThread; ++k)
      if (d[k] >= 0) a.out[d[k]][static_cast<int64_t>(s_base[d[k]]) + slot[k]] = rec[k];
    // the next tile's zeroing of s_count comes after this tile's second __syncthreads, and its s_base writes after
    // two more: no shared word is rewritten while it is still read
  }
}

}  // namespace

CB_ENTRY append(const cb_args* args, cudaStream_t stream) {
  if (args->world < 1 || args->world > CB_MAX_RANKS) return 1;
  if (args->dtype != CB_INT32 || args->count % 4 != 0) return 1;
  if (args->scratch_bytes < 8) return 2;
  AppendArgs k{};
  k.x = static_cast<const uint4*>(args->in);
  k.dest = static_cast<const int32_t*>(args->aux_in[0]);
  k.n = args->count / 4;
  if (args->aux_in_count[0] != k.n) return 1;
  for (int p = 0; p < args->world; ++p) {
    k.out[p] = static_cast<uint4*>(args->peer_out[p]);
    k.counter[p] = static_cast<uint32_t*>(args->peer_scratch[p]);
  }
  k.world = args->world;
  k.rank = args->rank;
  k.epoch = args->epoch;
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 3;
  int64_t grid = (k.n + kTile - 1) / kTile;
  if (grid > static_cast<int64_t>(kBlocksPerSm) * sms) grid = static_cast<int64_t>(kBlocksPerSm) * sms;
  if (grid < 1) grid = 1;  // even without records: block 0 zeroes this rank's counter for the next call
  append_kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(k);
  return cudaGetLastError() == cudaSuccess ? 0 : 4;
}
