// Reference: the decode-time row-parallel linear layer, y = sum_r x_r @ w_r^T, with its one-shot all-reduce fused
// into the same persistent kernel (the GEMV + custom all-reduce of inference engines, written as one kernel over
// peer memory).
//
// Rank r holds x_r [M, K] (M <= 64 tokens) and w_r [N, K] (row-major: each output feature's K weights are
// contiguous). The call streams the N * K weights once: it is bound by memory bandwidth, and the tensor cores
// (mma.sync m16n8k16, float32 accumulators) only keep the arithmetic off the critical path (at M = 16 a CUDA-core
// loop would need 16 FMAs per weight, about the H200's whole float32 rate).
//
// Work: a tile is ROWS = 16 * R consecutive weight rows (output features); a unit is (tile, split), split s of S
// covering chunks [s * C / S, (s + 1) * C / S) of the C = ceil(K / 32) chunks of 32 k. S > 1 only when the tiles
// alone leave blocks idle (small N, large K). Block b takes units b, b + G, ...; its 8 warps split the unit's
// chunks (warp w: chunks w, w + 8, ...), each with a private 4-stage cp.async pipeline that never drains between
// units (the next unit's first chunks are in flight while this unit's epilogue runs). Per chunk a lane copies
// 16 bytes of each of its weight rows and token rows into shared memory and reads back exactly those bytes, so no
// lane ever reads what another copied: the stages need no barrier. The k order inside a chunk is permuted
// identically for both operands (lane (g, t) holds k = 8t .. 8t + 7 of row g, which the mma sees as logical k
// {2t, 2t+1, 2t+8, 2t+9} of its first step and the same of its second), so one 16-byte load feeds two mma steps.
// The weights are operand A (16 rows x 16 k), the tokens operand B (16 k x 8 tokens; M is padded to 8, 16, 32 or
// 64 with zero rows).
//
// Epilogue of a unit: the 8 warps' accumulators are summed in shared memory (warp order 0..7), and the float32
// partial [M, ROWS] is stored into slot (r, s) of EVERY rank's scratch (its own included), then flag
// (tile, r, s) is raised on every rank. After its last unit, block b reduces tiles b, b + G, ...: it waits for
// the world * S flags of the tile on its own rank, sums the slots in the fixed order (rank 0 split 0, rank 0
// split 1, ..., rank world-1 split S-1), rounds once and stores y. Every rank adds the same float32 values in the
// same order: the bits agree on all ranks.
//
// Flags: word (tile * world + src) * S + s of rank p says "slot (src, s) of this tile is in p's scratch". Writers:
// __syncthreads(), then the signalling thread's __threadfence_system() and st.release.sys of `epoch`; waiters: poll
// with ld.acquire.sys until flag - epoch >= 0, __syncthreads(), then read the slots through L2 (ld.global.cg).
// Flags are never reset (epoch grows every call); the judge synchronises every device between calls, so a slot
// is never rewritten while a peer still reads it.
//
// Deadlock freedom: a block computes and publishes all its units before it waits for anything, and waits only
// for publications; so all blocks of all ranks on one GPU must be resident together: 1 block per SM (192 KiB of
// shared memory at most), G = SMs / (ranks on this GPU), from values every rank shares. This is the only kernel.
//
// Speed (target). The bound is the weight stream: in `cuda` each rank reads N * K * 2 bytes from its own HBM
// (about 4.3 TB/s read on an H200: 64 MiB in 16 us); in cuda-shared all ranks read from one HBM (64 MiB per rank
// at world 2: 134 MB, 31 us). The all-reduce adds (world - 1) * M * N * 4 bytes of pushes per rank (2 MiB per
// rank at world 4 with M = 16, N = 8192) and a reduction of world * M * N * 4 bytes, mostly overlapped: blocks
// reduce while slower blocks still stream weights. Target at 64 MiB: within 80 % of the weight-read time plus
// about 3 us, i.e. about 40 us per call at world 2, 80 us at world 4 and 160 us at world 8 in cuda-shared, and
// about 23 us in `cuda` (one GPU per rank).
#include "commbench.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kStages = 4;
constexpr int kChunk = 32;           // k per chunk: two m16n8k16 steps
constexpr int kMaxM = 64;
constexpr int kMaxSplit = 16;
constexpr int kMinSplitChunks = 8;   // a split covers at least 256 k

// TT: token tiles of 8 (M padded to 8 * TT). R: 16-row groups of weights per tile, as many as the accumulators
// (4 * R * TT floats per lane) allow.
template <int TT>
struct Cfg {
  static constexpr int R = TT <= 2 ? 4 : (TT <= 4 ? 2 : 1);
  static constexpr int ROWS = 16 * R;
  static constexpr int SLOTS = 2 * R + TT;             // 16-byte copies per lane and chunk
  static constexpr int STAGE_BYTES = SLOTS * 32 * 16;  // one warp's stage
  static constexpr int PIPE_BYTES = kStages * kWarps * STAGE_BYTES;
  static constexpr int RED_FLOATS = kWarps * TT * 8 * ROWS;
  static constexpr int SMEM = PIPE_BYTES + RED_FLOATS * 4;
};
static_assert(Cfg<1>::SMEM <= 227 * 1024 && Cfg<2>::SMEM <= 227 * 1024 && Cfg<4>::SMEM <= 227 * 1024 &&
              Cfg<8>::SMEM <= 227 * 1024, "shared memory of one block");

struct Args {
  const uint16_t* x;  // [M, K]
  const uint16_t* w;  // [N, K]
  uint16_t* y;        // [M, N]
  float* part[CB_MAX_RANKS];      // every rank's slots: [world * S][M][npad] float32
  uint32_t* flags[CB_MAX_RANKS];
  int64_t K;
  int M, N, tiles, npad, chunks, S, world, rank;
  uint32_t epoch;
};

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void wait_flag(const uint32_t* p, uint32_t epoch) {
  while (static_cast<int32_t>(ld_acquire_sys(p) - epoch) < 0) __nanosleep(32);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;  // 0: zero-filled, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

template <bool BF16>
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  if constexpr (BF16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

template <bool BF16>
__device__ __forceinline__ uint16_t to_bits(float f) {
  if constexpr (BF16) return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  else return __half_as_ushort(__float2half_rn(f));
}

// 8 elements k .. k + 7 of row `row` of a [rows, ld] matrix into 16 bytes of shared memory, zeros outside it.
// kAligned: ld is a multiple of 8 and the matrix 16-byte aligned, so the 8 elements are wholly inside or outside.
template <bool kAligned>
__device__ __forceinline__ void copy8(unsigned char* dst, const uint16_t* base, int row, int rows, int64_t ld,
                                      int64_t k) {
  if constexpr (kAligned) {
    const bool inside = row < rows && k < ld;
    cp_async16(dst, inside ? base + row * ld + k : base, inside);
  } else {
    uint32_t v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t k0 = k + 2 * e;
      const uint32_t lo = (row < rows && k0 < ld) ? __ldg(base + row * ld + k0) : 0u;
      const uint32_t hi = (row < rows && k0 + 1 < ld) ? __ldg(base + row * ld + k0 + 1) : 0u;
      v[e] = lo | (hi << 16);
    }
    *reinterpret_cast<uint4*>(dst) = make_uint4(v[0], v[1], v[2], v[3]);
  }
}

// Chunk c of the tile whose first weight row is n0, into one warp's stage: slot j < 2R holds weight row
// n0 + (j / 2) * 16 + (j % 2) * 8 + g, slot 2R + t token row 8t + g (g = lane / 4), k = 32c + 8 (lane % 4).
template <int TT, bool kAligned>
__device__ __forceinline__ void load_chunk(const Args& a, unsigned char* stage, int n0, int c, int lane) {
  using C = Cfg<TT>;
  const int g = lane >> 2;
  const int64_t k = static_cast<int64_t>(c) * kChunk + (lane & 3) * 8;
  unsigned char* d = stage + lane * 16;
#pragma unroll
  for (int j = 0; j < 2 * C::R; ++j)
    copy8<kAligned>(d + j * 512, a.w, n0 + (j >> 1) * 16 + (j & 1) * 8 + g, a.N, a.K, k);
#pragma unroll
  for (int t = 0; t < TT; ++t) copy8<kAligned>(d + (2 * C::R + t) * 512, a.x, t * 8 + g, a.M, a.K, k);
}

// Both mma steps of one chunk, from this lane's own 16-byte words of the stage.
template <int TT, bool BF16>
__device__ __forceinline__ void consume(const unsigned char* stage, int lane, float (&acc)[Cfg<TT>::R][TT][4]) {
  using C = Cfg<TT>;
  const uint4* s = reinterpret_cast<const uint4*>(stage) + lane;
  uint4 wv[2 * C::R], xv[TT];
#pragma unroll
  for (int j = 0; j < 2 * C::R; ++j) wv[j] = s[j * 32];
#pragma unroll
  for (int t = 0; t < TT; ++t) xv[t] = s[(2 * C::R + t) * 32];
#pragma unroll
  for (int r = 0; r < C::R; ++r)
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      const uint4 lo = wv[2 * r], hi = wv[2 * r + 1];
      mma16816<BF16>(acc[r][t], lo.x, hi.x, lo.y, hi.y, xv[t].x, xv[t].y);
      mma16816<BF16>(acc[r][t], lo.z, hi.z, lo.w, hi.w, xv[t].z, xv[t].w);
    }
}

// This warp's chunks of unit u: chunks first, first + 8, ... (count of them returned).
__device__ __forceinline__ int warp_chunks(const Args& a, int u, int warp, int* first) {
  const int split = u / a.tiles;
  const int cb = static_cast<int>(static_cast<int64_t>(split) * a.chunks / a.S);
  const int ce = static_cast<int>(static_cast<int64_t>(split + 1) * a.chunks / a.S);
  *first = cb + warp;
  return ce - cb > warp ? (ce - cb - warp + kWarps - 1) / kWarps : 0;
}

template <int TT, bool BF16, bool kAligned>
__global__ void __launch_bounds__(kThreads, 1) matmul_allreduce_kernel(const Args a) {
  using C = Cfg<TT>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  unsigned char* pipe = smem + warp * (kStages * C::STAGE_BYTES);
  float* red = reinterpret_cast<float*>(smem + C::PIPE_BYTES);
  const int G = gridDim.x;
  const int units = a.tiles * a.S;

  // The copy cursor runs kStages chunks ahead of the compute, across unit boundaries.
  int iu = blockIdx.x, ii = 0, ifirst = 0, icount = 0;
  while (iu < units && (icount = warp_chunks(a, iu, warp, &ifirst)) == 0) iu += G;
  auto issue = [&](unsigned char* stage) {
    if (iu < units) {
      load_chunk<TT, kAligned>(a, stage, (iu % a.tiles) * C::ROWS, ifirst + ii * kWarps, lane);
      if (++ii == icount) {
        ii = 0;
        iu += G;
        while (iu < units && (icount = warp_chunks(a, iu, warp, &ifirst)) == 0) iu += G;
      }
    }
    cp_async_commit();  // always, so that group i is chunk i of this warp's sequence
  };
#pragma unroll
  for (int s = 0; s < kStages; ++s) issue(pipe + s * C::STAGE_BYTES);

  int seq = 0;  // chunks computed so far by this warp
  for (int u = blockIdx.x; u < units; u += G) {
    const int tile = u % a.tiles, split = u / a.tiles;
    float acc[C::R][TT][4];
#pragma unroll
    for (int r = 0; r < C::R; ++r)
#pragma unroll
      for (int t = 0; t < TT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[r][t][e] = 0.f;
    int first;
    const int n = warp_chunks(a, u, warp, &first);
    for (int i = 0; i < n; ++i, ++seq) {
      cp_async_wait<kStages - 1>();  // chunk `seq` has landed (this lane's part, which is all it reads)
      unsigned char* stage = pipe + (seq % kStages) * C::STAGE_BYTES;
      consume<TT, BF16>(stage, lane, acc);
      issue(stage);  // after the reads of this stage, in program order
    }

    // epilogue: accumulators -> red[warp][token][row] (c0: row g, token 2t; c1: token 2t+1; c2, c3: row g + 8)
    {
      const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
      for (int r = 0; r < C::R; ++r)
#pragma unroll
        for (int t = 0; t < TT; ++t) {
          float* p = red + (warp * TT * 8 + t * 8 + 2 * t4) * C::ROWS + r * 16 + g;
          p[0] = acc[r][t][0];
          p[C::ROWS] = acc[r][t][1];
          p[8] = acc[r][t][2];
          p[C::ROWS + 8] = acc[r][t][3];
        }
    }
    __syncthreads();
    {
      constexpr int Q4 = C::ROWS / 4;
      const int64_t slot = static_cast<int64_t>(a.rank * a.S + split) * a.M;
      for (int q = threadIdx.x; q < TT * 8 * Q4; q += kThreads) {
        const int tok = q / Q4, c4 = (q % Q4) * 4;
        if (tok >= a.M) continue;
        float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          const float4 v = *reinterpret_cast<const float4*>(red + (w * TT * 8 + tok) * C::ROWS + c4);
          s.x += v.x;
          s.y += v.y;
          s.z += v.z;
          s.w += v.w;
        }
        const int64_t off = (slot + tok) * a.npad + static_cast<int64_t>(tile) * C::ROWS + c4;
        for (int j = 0; j < a.world; ++j) {  // start with the next rank: the ranks do not all hit one at once
          int p = a.rank + 1 + j;
          if (p >= a.world) p -= a.world;
          *reinterpret_cast<float4*>(a.part[p] + off) = s;
        }
      }
    }
    __syncthreads();  // every store of the slot is issued, and red is read before the next unit writes it
    if (threadIdx.x < a.world) {
      __threadfence_system();
      st_release_sys(a.flags[threadIdx.x] + (tile * a.world + a.rank) * a.S + split, a.epoch);
    }
  }
  cp_async_wait<0>();  // only empty groups are left

  // reduction of this block's tiles, in the fixed slot order
  const int nf = a.world * a.S;
  const float* own = a.part[a.rank];
  for (int tile = blockIdx.x; tile < a.tiles; tile += G) {
    for (int i = threadIdx.x; i < nf; i += kThreads) wait_flag(a.flags[a.rank] + tile * nf + i, a.epoch);
    __syncthreads();
    constexpr int Q4 = C::ROWS / 4;
    for (int q = threadIdx.x; q < a.M * Q4; q += kThreads) {
      const int m = q / Q4;
      const int n = tile * C::ROWS + (q % Q4) * 4;
      if (n >= a.N) continue;
      const float* src = own + static_cast<int64_t>(m) * a.npad + n;
      const int64_t stride = static_cast<int64_t>(a.M) * a.npad;
      float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int j = 0; j < nf; ++j) {
        const float4 v = __ldcg(reinterpret_cast<const float4*>(src + j * stride));
        s.x += v.x;
        s.y += v.y;
        s.z += v.z;
        s.w += v.w;
      }
      uint16_t* dst = a.y + static_cast<int64_t>(m) * a.N + n;
      const float f[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (n + e < a.N) dst[e] = to_bits<BF16>(f[e]);
    }
  }
}

// Ranks that share this rank's GPU: the judge puts either every rank on one GPU (cuda-shared) or one rank on
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

template <int TT, bool BF16, bool kAligned>
int launch(Args a, const cb_args* args, cudaStream_t stream) {
  using C = Cfg<TT>;
  auto kernel = matmul_allreduce_kernel<TT, BF16, kAligned>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM) != cudaSuccess) return 2;
  int sms = 0, occ = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, kThreads, C::SMEM) != cudaSuccess) return 2;
  if (occ < 1) return 5;
  // one block per SM (the shared memory allows no more), from values every rank shares
  int64_t grid = sms / ranks_per_gpu(args);
  if (grid < 1) return 5;
  a.tiles = (a.N + C::ROWS - 1) / C::ROWS;
  a.npad = a.tiles * C::ROWS;
  a.chunks = static_cast<int>((a.K + kChunk - 1) / kChunk);
  // split k over blocks only when the tiles alone leave blocks idle
  int64_t s = (grid + a.tiles - 1) / a.tiles;
  if (s > kMaxSplit) s = kMaxSplit;
  if (s > a.chunks / kMinSplitChunks) s = a.chunks / kMinSplitChunks;
  if (s < 1) s = 1;
  auto fits = [&](int64_t v) {
    return static_cast<int64_t>(a.world) * v * a.M * a.npad * 4 <= args->scratch_bytes &&
           static_cast<int64_t>(a.tiles) * a.world * v <= args->flag_words;
  };
  while (s > 1 && !fits(s)) --s;
  if (!fits(s)) return 5;
  a.S = static_cast<int>(s);
  if (grid > static_cast<int64_t>(a.tiles) * a.S) grid = static_cast<int64_t>(a.tiles) * a.S;
  kernel<<<static_cast<unsigned>(grid), kThreads, C::SMEM, stream>>>(a);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}

template <int TT>
int pick(const Args& a, const cb_args* args, cudaStream_t stream, bool bf16, bool aligned) {
  if (bf16) return aligned ? launch<TT, true, true>(a, args, stream) : launch<TT, true, false>(a, args, stream);
  return aligned ? launch<TT, false, true>(a, args, stream) : launch<TT, false, false>(a, args, stream);
}

}  // namespace

CB_ENTRY matmul_allreduce(const cb_args* args, cudaStream_t stream) {
  const bool bf16 = args->dtype == CB_BFLOAT16;
  if (!bf16 && args->dtype != CB_FLOAT16) return 1;
  const int world = args->world;
  if (world < 1 || world > CB_MAX_RANKS) return 1;
  const int64_t K = args->params[0];
  if (K < 1 || args->count % K != 0 || args->aux_in_count[0] % K != 0) return 4;
  const int64_t M = args->count / K, N = args->aux_in_count[0] / K;
  if (M < 1 || M > kMaxM || N < 1 || N > (1 << 20) || args->out_count != M * N) return 4;

  Args a{};
  a.x = static_cast<const uint16_t*>(args->in);
  a.w = static_cast<const uint16_t*>(args->aux_in[0]);
  a.y = static_cast<uint16_t*>(args->out);
  for (int p = 0; p < world; ++p) {
    a.part[p] = static_cast<float*>(args->peer_scratch[p]);
    a.flags[p] = args->peer_flags[p];
  }
  a.K = K;
  a.M = static_cast<int>(M);
  a.N = static_cast<int>(N);
  a.world = world;
  a.rank = args->rank;
  a.epoch = args->epoch;
  const uintptr_t bits = reinterpret_cast<uintptr_t>(args->in) | reinterpret_cast<uintptr_t>(args->aux_in[0]);
  const bool aligned = K % 8 == 0 && (bits & 15) == 0;  // (the judge's buffers are 256-byte aligned)
  if (M <= 8) return pick<1>(a, args, stream, bf16, aligned);
  if (M <= 16) return pick<2>(a, args, stream, bf16, aligned);
  if (M <= 32) return pick<4>(a, args, stream, bf16, aligned);
  return pick<8>(a, args, stream, bf16, aligned);
}
