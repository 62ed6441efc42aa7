// Reference: latency-bound all-to-all with NCCL's LL (low-latency) protocol.
//
// Inputs and outputs are private, so rank r must push block p of its input into rank p's scratch, and rank p
// must move it from there into block r of its own output, in the same call. Each block of B bytes is cut into
// nlines = ceil(B / 8) pieces of 8 bytes (the last one zero-padded); piece i of the block that rank s sends to
// rank p lands in slot s, line i of rank p's scratch as ONE 16-byte line of two 8-byte words
// {(epoch << 32) | lo32, (epoch << 32) | hi32}, written with st.volatile.global.v2.u64. An aligned 8-byte word is
// single-copy atomic, so once both flag halves of a line hold this call's epoch, both data halves are the ones
// sent with them: the receiver polls the lines of its own scratch with ld.volatile.global.v2.u64 and writes the
// payload into its output as soon as they match. No fence, no separate flag, no barrier round trip: the data is
// the signal. The own block is copied from `in` to `out` directly.
//
// Flags are the epoch (1, 2, 3, ..., one per call, the same on every rank), so scratch is never reset: zeroed
// scratch and lines left by an earlier call carry another value and never match. The judge waits for every rank
// between calls, so a line is never overwritten by the next call before it was read.
//
// Alignment: `in` and `out` are 256-byte aligned, but block j starts at byte j * B. The kernel is specialised on
// the widest word W in {8, 4, 2, 1} that divides B: every block start and every piece start (a multiple of 8
// inside a block) is then W-aligned, so a piece is 8 / W aligned loads (one for W = 8) and the last, partial piece
// (B - 8 * i bytes, also a multiple of W) is fewer of them. Scratch lines are always 16-byte aligned.
//
// Work split: the (world - 1) * nlines remote lines of a rank are numbered k = (d - 1) * nlines + i for the
// peer at distance d = 1 .. world - 1 and piece i, and thread t of the grid takes k = t, t + stride, ...: it
// sends line k to rank (rank + d) % world (consecutive threads store consecutive lines of one peer: coalesced,
// and the ranks start on different peers), then copies its share of the own block, then receives line k from
// rank (rank - d) % world. All polls of a group of kUnroll lines are issued before any is checked, so their
// round trips overlap. Sends never wait, so the kernel cannot deadlock as long as every block of every rank is
// resident: with all ranks on one GPU the grid is capped at SMs / (2 * world) blocks per rank (one 512-thread
// block per SM always fits), with one rank per GPU at one block per SM.
//
// Latency target (metric latency; 32 B to 16 KiB per peer): one kernel whose critical path is one remote 16-byte
// store and one local poll, nearly flat in size, one line per thread up to 4 KiB per peer at world 8 (3584 lines,
// 7 blocks). On one H200 in cuda-shared the call is dominated by getting world kernels onto one GPU: expect about
// what collective/allreduce_ll_small measures there (about 7 us at world 2 and 12 us at world 4), since it moves
// the same lines with no reduction. With one rank per GPU over NVLink the floor is a kernel launch plus one
// remote write (about 2-3 us on H100/H200 NVSwitch systems); NCCL's all-to-all, built from grouped send/recv
// with its own launch and handshakes, sits in the tens of microseconds at these sizes on 8 GPUs (nccl-tests
// alltoall_perf; not measured here), so this kernel should beat it clearly. None of these figures is measured
// yet for this kernel: the first GPU validation fixes them.
#include "commbench.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // polls in flight per thread

int64_t dtype_bytes(int dtype) {
  switch (dtype) {
    case CB_FLOAT64: case CB_INT64: return 8;
    case CB_FLOAT32: case CB_INT32: return 4;
    case CB_FLOAT16: case CB_BFLOAT16: return 2;
    case CB_UINT8: return 1;
    default: return 0;
  }
}

__device__ __forceinline__ void st_line(ulonglong2* p, uint64_t w0, uint64_t w1) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(w0), "l"(w1) : "memory");
}

__device__ __forceinline__ ulonglong2 ld_line(const ulonglong2* p) {
  ulonglong2 v;
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ bool line_ready(const ulonglong2& v, uint32_t epoch) {
  return static_cast<uint32_t>(v.x >> 32) == epoch && static_cast<uint32_t>(v.y >> 32) == epoch;
}

__device__ __forceinline__ uint64_t line_payload(const ulonglong2& v) {
  return (v.x & 0xFFFFFFFFull) | (v.y << 32);
}

template <int W> struct Unit;
template <> struct Unit<8> { using type = uint64_t; };
template <> struct Unit<4> { using type = uint32_t; };
template <> struct Unit<2> { using type = uint16_t; };
template <> struct Unit<1> { using type = uint8_t; };

// The n valid bytes (1 .. 8, a multiple of W) at p, W-aligned, as the low bytes of a word; the rest is zero.
template <int W>
__device__ __forceinline__ uint64_t load_piece(const unsigned char* p, int n) {
  using U = typename Unit<W>::type;
  if constexpr (W == 8) {
    return *reinterpret_cast<const uint64_t*>(p);  // B % 8 == 0: every piece is whole
  } else {
    uint64_t w = 0;
#pragma unroll
    for (int j = 0; j < 8 / W; ++j)
      if (j * W < n) w |= static_cast<uint64_t>(*reinterpret_cast<const U*>(p + j * W)) << (8 * W * j);
    return w;
  }
}

template <int W>
__device__ __forceinline__ void store_piece(unsigned char* p, int n, uint64_t w) {
  using U = typename Unit<W>::type;
  if constexpr (W == 8) {
    *reinterpret_cast<uint64_t*>(p) = w;
  } else {
#pragma unroll
    for (int j = 0; j < 8 / W; ++j)
      if (j * W < n) *reinterpret_cast<U*>(p + j * W) = static_cast<U>(w >> (8 * W * j));
  }
}

struct Peers { ulonglong2* scratch[CB_MAX_RANKS]; };

struct A2AArgs {
  const unsigned char* in;
  unsigned char* out;
  Peers peers;       // every rank's scratch as lines (entry rank: this rank's own, which it polls)
  int64_t block;     // B: bytes of one block
  int64_t nlines;    // ceil(B / 8): one slot of nlines lines per source rank
  int rank, world;
  uint32_t epoch;
};

__device__ __forceinline__ int piece_bytes(const A2AArgs& a, int64_t i) {
  const int64_t left = a.block - i * 8;
  return left >= 8 ? 8 : static_cast<int>(left);
}

template <int W>
__global__ void __launch_bounds__(kThreads, 1) ll_alltoall_kernel(const __grid_constant__ A2AArgs a) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t remote = static_cast<int64_t>(a.world - 1) * a.nlines;
  const uint64_t tag = static_cast<uint64_t>(a.epoch) << 32;

  // 1. send: line k = (d - 1) * nlines + i goes to slot `rank`, line i of rank (rank + d) % world
  for (int64_t k = first; k < remote; k += stride) {
    const int d = static_cast<int>(k / a.nlines) + 1;
    const int64_t i = k - static_cast<int64_t>(d - 1) * a.nlines;
    int p = a.rank + d;
    if (p >= a.world) p -= a.world;
    const uint64_t w = load_piece<W>(a.in + p * a.block + i * 8, piece_bytes(a, i));
    st_line(a.peers.scratch[p] + static_cast<int64_t>(a.rank) * a.nlines + i, tag | (w & 0xFFFFFFFFull),
            tag | (w >> 32));
  }

  // 2. the own block, straight from in to out
  for (int64_t i = first; i < a.nlines; i += stride) {
    const int n = piece_bytes(a, i);
    const int64_t off = a.rank * a.block + i * 8;
    store_piece<W>(a.out + off, n, load_piece<W>(a.in + off, n));
  }

  // 3. receive the same line numbers: line k comes from rank s = (rank - d) % world, slot s, line i; it goes to
  //    block s of out
  const ulonglong2* mine = a.peers.scratch[a.rank];
  for (int64_t base = first; base < remote; base += kUnroll * stride) {
    ulonglong2 v[kUnroll];
    const ulonglong2* line[kUnroll];
    int src[kUnroll];
    int64_t piece[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = base + u * stride;
      if (k < remote) {
        const int d = static_cast<int>(k / a.nlines) + 1;
        piece[u] = k - static_cast<int64_t>(d - 1) * a.nlines;
        int s = a.rank - d;
        if (s < 0) s += a.world;
        src[u] = s;
        line[u] = mine + static_cast<int64_t>(s) * a.nlines + piece[u];
        v[u] = ld_line(line[u]);  // every poll of the group is issued before any is checked
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * stride < remote) {
        while (!line_ready(v[u], a.epoch)) v[u] = ld_line(line[u]);
        store_piece<W>(a.out + src[u] * a.block + piece[u] * 8, piece_bytes(a, piece[u]), line_payload(v[u]));
      }
    }
  }
}

// Ranks that share this rank's GPU. The judge puts either every rank on one GPU (cuda-shared) or one rank on
// each GPU (cuda), so the right neighbour tells which; every rank computes the same answer.
int ranks_per_gpu(const cb_args* a) {
  if (a->world < 2) return 1;
  cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, a->peer_scratch[(a->rank + 1) % a->world]) != cudaSuccess) {
    (void)cudaGetLastError();
    return a->world;  // unknown: assume the worst
  }
  return at.device == a->device ? a->world : 1;
}

}  // namespace

CB_ENTRY all_to_all(const cb_args* args, cudaStream_t stream) {
  const int64_t esz = dtype_bytes(args->dtype);
  if (esz == 0 || args->world < 1 || args->world > CB_MAX_RANKS) return 1;
  if (args->out_count != args->count || args->count % args->world != 0) return 4;
  const int64_t block = args->count / args->world * esz;
  if (block <= 0) return 0;  // every rank has the same count: nobody waits
  A2AArgs k{};
  k.in = static_cast<const unsigned char*>(args->in);
  k.out = static_cast<unsigned char*>(args->out);
  k.block = block;
  k.nlines = (block + 7) / 8;
  k.rank = args->rank;
  k.world = args->world;
  k.epoch = args->epoch;
  for (int p = 0; p < args->world; ++p) {
    k.peers.scratch[p] = static_cast<ulonglong2*>(args->peer_scratch[p]);
    if (k.peers.scratch[p] == nullptr || (reinterpret_cast<uintptr_t>(k.peers.scratch[p]) & 15) != 0) return 5;
  }
  if (args->scratch_bytes < static_cast<int64_t>(args->world) * k.nlines * 16) return 4;  // all scratches equal
  if (((reinterpret_cast<uintptr_t>(k.in) | reinterpret_cast<uintptr_t>(k.out)) & 7) != 0) return 6;

  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  const int64_t work = args->world > 1 ? static_cast<int64_t>(args->world - 1) * k.nlines : k.nlines;
  int64_t grid = (work + kThreads - 1) / kThreads;  // one line per thread where residency allows
  const int rpg = ranks_per_gpu(args);
  const int64_t resident = rpg > 1 ? sms / (2 * rpg) : sms;  // one block per SM is guaranteed resident
  if (grid > resident) grid = resident;
  if (grid < 1) grid = 1;
  const unsigned g = static_cast<unsigned>(grid);
  if (block % 8 == 0) ll_alltoall_kernel<8><<<g, kThreads, 0, stream>>>(k);
  else if (block % 4 == 0) ll_alltoall_kernel<4><<<g, kThreads, 0, stream>>>(k);
  else if (block % 2 == 0) ll_alltoall_kernel<2><<<g, kThreads, 0, stream>>>(k);
  else ll_alltoall_kernel<1><<<g, kThreads, 0, stream>>>(k);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
