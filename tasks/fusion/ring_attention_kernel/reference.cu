// Reference: ring attention forward (non-causal) in ONE kernel per rank: K/V blocks rotate around the ring
// through a double-buffered slot pair in each rank's scratch, while tensor-core attention (mma.sync m16n8k16,
// float32 accumulators, online softmax) runs over the block a rank holds.
//
// Rank r holds q [n, H, 64] and its keys and values k, v [n, Hkv, 64] (private: no other rank can read them). At
// step t = 0 .. world-1 it holds the K/V block of rank (r - t) mod world: its own inputs at step 0, its slot t % 2
// afterwards. It forwards the block it holds at step t (t <= world - 2) into slot (t + 1) % 2 of rank r + 1, which
// needs exactly that block at its step t + 1. Two kinds of blocks share the grid:
//   - C copy blocks: copy block c moves its fixed share c of the block's bytes (the same share on every rank):
//       1. (t >= 1) wait until share c has arrived in our slot t % 2 (arrival flag (t, c), set by rank r - 1);
//       2. (t >= 2) wait until rank r + 1 no longer reads its slot (t + 1) % 2, which held its step t - 1: every
//          compute block of r + 1 has finished step t - 1 and its copy block c has forwarded share c of it (free
//          flags, which rank r + 1 sets in OUR flag words);
//       3. copy share c (16-byte words, 8 in flight per thread), then raise arrival flag (t + 1, c) on rank r + 1
//          and, for t >= 1, free flag "copy c done with step t" on rank r - 1.
//   - G compute blocks: block b owns the items (query tile of 128 rows, head) b, b + G, ... in every step. For
//     each step it waits for the C arrival flags of that step (none at step 0), folds the held block into each of
//     its items' running state (the float32 output accumulator, running max and running sum, kept in this rank's
//     scratch between steps in the mma fragment layout, 144 bytes per (row, head)), writes out and lse at the last
//     step, and then tells rank r - 1 that it is done with the slot of this step.
// The attention: 8 warps per block, 16 query rows each; 64-key tiles of K and V double-buffered in shared memory
// by cp.async.cg (zero-filled beyond n, masked to -inf in the scores); Q fragments straight from global memory;
// S = Q K^T and O += P V with mma.sync, K fragments by ldmatrix, V fragments by ldmatrix.trans; P is re-used from
// the S accumulators as the A operand (the FlashAttention-2 register layout), the running sum is a per-thread
// partial summed over the quad at the end. exp2 of scores pre-scaled by log2(e) / sqrt(64).
//
// Flags: arrival (t, c) at word t * C + c, compute-done (t, b) at W * C + t * G + b, copy-done (t, c) at
// W * C + W * G + t * C + c; each word is written at most once per call, with the call's epoch (st.release.sys
// after __syncthreads() and __threadfence_system()), and waited for with ld.acquire.sys until flag - epoch >= 0,
// so nothing is ever reset and a word from an earlier call never looks fresh. Data another rank wrote in this call
// is read through L2 only (cp.async.cg, ld.global.cg): never a stale L1 line from an earlier step's use of the
// slot. A slot is overwritten only after every reader of its previous block released it (compute blocks after
// cp.async.wait_group 0, copy blocks after the loads fed their stores, both before the release).
//
// Deadlock freedom: copy (r, t) waits only for copy (r - 1, t - 1), compute (r + 1, t - 1) and copy (r + 1, t - 1);
// compute (r, t) only for copy (r - 1, t - 1): every wait is on a strictly earlier step, so the steps complete in
// order provided every block of every rank is resident at once. C + G = (blocks per SM, at most 2) * SMs /
// (ranks on this GPU), from values every rank shares, and this is the only kernel.
//
// Speed (target, to be confirmed on the H200): the call is bound by the tensor cores and the softmax's exp2 (at
// head dimension 64 the exponentials cost about as much issue time as the MMAs). The transfer of a block (4 MiB
// at the benchmark's n = 2048, 8 kv heads) is hidden behind the compute of the previous step: a step's compute is
// 4 * n^2 * H * 64 FLOPs per rank (8.6 GFLOP at the benchmark size). An mma.sync kernel of this simple shape
// (no warp specialisation, no wgmma) should reach about 200-250 TFLOP/s for the whole GPU, i.e. about 100-125
// TFLOP/s per rank at world 2 in cuda-shared (all ranks share the tensor cores), 200+ per rank in `cuda`.
#include "commbench.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr int kD = 64;          // head dimension
constexpr int kBM = 128;        // query rows per item
constexpr int kBN = 64;         // keys per shared-memory tile
constexpr int kWarps = 8;       // 16 query rows per warp
constexpr int kThreads = kWarps * 32;
constexpr int kLd = kD + 8;     // shared row stride in elements: 144 bytes, conflict-free ldmatrix rows
constexpr int kTile = kBN * kLd;
constexpr int kState = 36;      // floats of running state per thread: O 8 x 4, max 2, sum 2
constexpr int kCopyUnroll = 8;  // 16-byte words in flight per copying thread
constexpr int kMaxBlocksPerSm = 2;

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void wait_flag(const uint32_t* p, uint32_t epoch) {
  while (static_cast<int32_t>(ld_acquire_sys(p) - epoch) < 0) __nanosleep(64);
}

// Every thread of the block calls this: words p[0 .. count) all reach `epoch`, then the block goes on.
__device__ __forceinline__ void wait_all(const uint32_t* p, int count, uint32_t epoch) {
  for (int i = threadIdx.x; i < count; i += kThreads) wait_flag(p + i, epoch);
  __syncthreads();
}

__device__ __forceinline__ void cp_async16(uint32_t smem, const void* gmem, bool valid) {
  const int bytes = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled and nothing is read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ void ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

__device__ __forceinline__ float fast_exp2(float x) {  // ex2.approx(-inf) = +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The 16-bit type's tensor-core instruction and conversions.
template <typename T> struct Ops;
template <> struct Ops<__nv_bfloat16> {
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low 16 bits) = lo
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ uint16_t one(float f) {
    __nv_bfloat16 v = __float2bfloat16_rn(f);
    return *reinterpret_cast<uint16_t*>(&v);
  }
};
template <> struct Ops<__half> {
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ uint16_t one(float f) {
    __half v = __float2half_rn(f);
    return *reinterpret_cast<uint16_t*>(&v);
  }
};

struct RingArgs {
  const uint16_t* q;      // own q [n, H, 64]
  const uint16_t* k;      // own k [n, Hkv, 64]
  const uint16_t* v;      // own v
  uint16_t* out;          // [n, H, 64]
  uint16_t* lse;          // [n, H]
  float* state;           // own scratch: items x warps x kState x 32 floats
  char* slot[2];          // own slots: K block [n, Hkv, 64] then V block
  char* next_slot[2];     // the slots of rank + 1
  uint32_t* flags;        // own flag words
  uint32_t* prev_flags;   // rank - 1's
  uint32_t* next_flags;   // rank + 1's
  int64_t n;
  int64_t kv_bytes;       // bytes of one of K, V: n * Hkv * 64 * 2
  int heads, kv_heads, group, world, qtiles, items, G, C;
  uint32_t epoch;
  float scale_log2;       // log2(e) / sqrt(64)
};

__device__ __forceinline__ int arr_word(const RingArgs& a, int t, int c) { return t * a.C + c; }
__device__ __forceinline__ int cdone_word(const RingArgs& a, int t) { return a.world * a.C + t * a.G; }
__device__ __forceinline__ int fdone_word(const RingArgs& a, int t, int c) {
  return a.world * a.C + a.world * a.G + t * a.C + c;
}

__device__ __forceinline__ void copy_role(const RingArgs& a, int c) {
  const int tid = threadIdx.x;
  const int64_t half = a.kv_bytes / 16;  // 16-byte words of K (then as many of V)
  const int64_t u0 = 2 * half * c / a.C, u1 = 2 * half * (c + 1) / a.C;
  for (int t = 0; t + 1 < a.world; ++t) {
    if (t >= 1) wait_all(a.flags + arr_word(a, t, c), 1, a.epoch);
    if (t >= 2) {
      wait_all(a.flags + cdone_word(a, t - 1), a.G, a.epoch);
      wait_all(a.flags + fdone_word(a, t - 1, c), 1, a.epoch);
    }
    const uint4* sk = t == 0 ? reinterpret_cast<const uint4*>(a.k) : reinterpret_cast<const uint4*>(a.slot[t & 1]);
    const uint4* sv = t == 0 ? reinterpret_cast<const uint4*>(a.v) : sk + half;
    uint4* dst = reinterpret_cast<uint4*>(a.next_slot[(t + 1) & 1]);
    for (int64_t u = u0 + tid; u < u1; u += static_cast<int64_t>(kThreads) * kCopyUnroll) {
      uint4 w[kCopyUnroll];
#pragma unroll
      for (int i = 0; i < kCopyUnroll; ++i) {
        const int64_t x = u + static_cast<int64_t>(i) * kThreads;
        if (x < u1) w[i] = x < half ? __ldcg(sk + x) : __ldcg(sv + (x - half));
      }
#pragma unroll
      for (int i = 0; i < kCopyUnroll; ++i) {
        const int64_t x = u + static_cast<int64_t>(i) * kThreads;
        if (x < u1) dst[x] = w[i];
      }
    }
    __syncthreads();  // every store issued, every load of our slot returned
    if (tid == 0) {
      __threadfence_system();
      st_release_sys(a.next_flags + arr_word(a, t + 1, c), a.epoch);
      if (t >= 1) st_release_sys(a.prev_flags + fdone_word(a, t, c), a.epoch);
    }
  }
}

// Fold the K/V block (kb, vb: [n, Hkv, 64]) into item `item`'s state; `first` starts the state, `last` ends it.
template <typename T>
__device__ __forceinline__ void attend_item(const RingArgs& a, int item, const uint16_t* kb, const uint16_t* vb, bool first,
                            bool last, uint16_t (*ks)[kTile], uint16_t (*vs)[kTile]) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int h = item / a.qtiles, qt = item - h * a.qtiles;
  const int kvh = h / a.group;
  const int64_t n = a.n;
  const int64_t row_a = static_cast<int64_t>(qt) * kBM + warp * 16 + g, row_b = row_a + 8;

  // K/V tile loader: 64 keys x 8 chunks of 16 bytes each, for K and for V
  auto load_tile = [&](int it, int stage) {
    for (int x = tid; x < kBN * 8; x += kThreads) {
      const int key = x >> 3, ch = x & 7;
      const int64_t gk = static_cast<int64_t>(it) * kBN + key;
      const bool ok = gk < n;
      const int64_t off = ((ok ? gk : 0) * a.kv_heads + kvh) * kD + ch * 8;
      cp_async16(static_cast<uint32_t>(__cvta_generic_to_shared(&ks[stage][key * kLd + ch * 8])), kb + off, ok);
      cp_async16(static_cast<uint32_t>(__cvta_generic_to_shared(&vs[stage][key * kLd + ch * 8])), vb + off, ok);
    }
    cp_async_commit();
  };
  const int ntiles = static_cast<int>((n + kBN - 1) / kBN);
  load_tile(0, 0);

  // Q fragments (A operand, 16 x 16 per k-step): rows g and g + 8, columns 2 tq (+1) and 2 tq + 8 (+1)
  uint32_t qf[4][4];
  {
    const uint32_t* qa = reinterpret_cast<const uint32_t*>(a.q + (row_a * a.heads + h) * kD);
    const uint32_t* qb = reinterpret_cast<const uint32_t*>(a.q + (row_b * a.heads + h) * kD);
    const bool va = row_a < n, vb_ok = row_b < n;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      qf[kk][0] = va ? __ldg(qa + kk * 8 + tq) : 0u;
      qf[kk][1] = vb_ok ? __ldg(qb + kk * 8 + tq) : 0u;
      qf[kk][2] = va ? __ldg(qa + kk * 8 + 4 + tq) : 0u;
      qf[kk][3] = vb_ok ? __ldg(qb + kk * 8 + 4 + tq) : 0u;
    }
  }

  float o[8][4], m[2], l[2];
  float* st = a.state + (static_cast<int64_t>(item) * kWarps + warp) * (kState * 32) + lane;
  if (first) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[j][i] = 0.f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[j][i] = st[(j * 4 + i) * 32];
    m[0] = st[32 * 32], m[1] = st[33 * 32], l[0] = st[34 * 32], l[1] = st[35 * 32];
  }

  const int mi = lane >> 3, mr = lane & 7;  // ldmatrix: this lane's matrix and row
  for (int it = 0; it < ntiles; ++it) {
    if (it + 1 < ntiles) {
      load_tile(it + 1, (it + 1) & 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint32_t kbase = static_cast<uint32_t>(__cvta_generic_to_shared(ks[it & 1]));
    const uint32_t vbase = static_cast<uint32_t>(__cvta_generic_to_shared(vs[it & 1]));

    // S = Q K^T: n-tile j = keys 8j .. 8j+7. x4: matrices (keys 8j.., d 16kk + 8 mi) for kk, kk+1
    float s[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[j][i] = 0.f;
#pragma unroll
    for (int kk = 0; kk < 4; kk += 2) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4(b0, b1, b2, b3, kbase + ((8 * j + mr) * kLd + 16 * kk + 8 * mi) * 2);
        Ops<T>::mma(s[j], qf[kk], b0, b1);
        Ops<T>::mma(s[j], qf[kk + 1], b2, b3);
      }
    }

    // online softmax (log2 domain); keys at or beyond n are masked
    const int64_t valid = n - static_cast<int64_t>(it) * kBN;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = 8 * j + 2 * tq + (i & 1);
        const float x = col < valid ? s[j][i] * a.scale_log2 : -INFINITY;
        s[j][i] = x;
        mx[i >> 1] = fmaxf(mx[i >> 1], x);
      }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);  // finite: every tile holds at least one valid key
      alpha[r] = fast_exp2(m[r] - m_new);       // 0 on the first tile (m = -inf)
      m[r] = m_new;
    }
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float p = fast_exp2(s[j][i] - m[i >> 1]);
        s[j][i] = p;
        sum[i >> 1] += p;
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + sum[r];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }

    // O += P V: k-step kk2 = keys 16 kk2 .. +15 (P from S tiles 2 kk2, 2 kk2 + 1); x4.trans: matrices
    // (keys 16 kk2 + 8 (mi & 1) .., d 8 jd + 8 (mi >> 1)) give the B fragments of d-tiles jd and jd + 1
#pragma unroll
    for (int kk2 = 0; kk2 < 4; ++kk2) {
      uint32_t pa[4];
      pa[0] = Ops<T>::pack(s[2 * kk2][0], s[2 * kk2][1]);
      pa[1] = Ops<T>::pack(s[2 * kk2][2], s[2 * kk2][3]);
      pa[2] = Ops<T>::pack(s[2 * kk2 + 1][0], s[2 * kk2 + 1][1]);
      pa[3] = Ops<T>::pack(s[2 * kk2 + 1][2], s[2 * kk2 + 1][3]);
#pragma unroll
      for (int jd = 0; jd < 8; jd += 2) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4_t(b0, b1, b2, b3, vbase + ((16 * kk2 + 8 * (mi & 1) + mr) * kLd + 8 * jd + 8 * (mi >> 1)) * 2);
        Ops<T>::mma(o[jd], pa, b0, b1);
        Ops<T>::mma(o[jd + 1], pa, b2, b3);
      }
    }
    __syncthreads();  // every warp is done with this stage before the next iteration refills it
  }

  if (!last) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) st[(j * 4 + i) * 32] = o[j][i];
    st[32 * 32] = m[0], st[33 * 32] = m[1], st[34 * 32] = l[0], st[35 * 32] = l[1];
    return;
  }
  // the end: sum the quad's partial sums, out = O / l, lse = (m + log2 l) * ln 2
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  const float inv_a = 1.f / l[0], inv_b = 1.f / l[1];
  if (row_a < n) {
    uint32_t* oa = reinterpret_cast<uint32_t*>(a.out + (row_a * a.heads + h) * kD);
#pragma unroll
    for (int j = 0; j < 8; ++j) oa[j * 4 + tq] = Ops<T>::pack(o[j][0] * inv_a, o[j][1] * inv_a);
    if (tq == 0) a.lse[row_a * a.heads + h] = Ops<T>::one((m[0] + log2f(l[0])) * 0.69314718055994531f);
  }
  if (row_b < n) {
    uint32_t* ob = reinterpret_cast<uint32_t*>(a.out + (row_b * a.heads + h) * kD);
#pragma unroll
    for (int j = 0; j < 8; ++j) ob[j * 4 + tq] = Ops<T>::pack(o[j][2] * inv_b, o[j][3] * inv_b);
    if (tq == 0) a.lse[row_b * a.heads + h] = Ops<T>::one((m[1] + log2f(l[1])) * 0.69314718055994531f);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads, kMaxBlocksPerSm) ring_kernel(const __grid_constant__ RingArgs a) {
  __shared__ alignas(128) uint16_t ks[2][kTile];
  __shared__ alignas(128) uint16_t vs[2][kTile];
  if (static_cast<int>(blockIdx.x) < a.C) {
    copy_role(a, blockIdx.x);
    return;
  }
  const int b = blockIdx.x - a.C;
  for (int t = 0; t < a.world; ++t) {
    if (t >= 1) wait_all(a.flags + arr_word(a, t, 0), a.C, a.epoch);  // every share of this step's block is here
    const uint16_t* kb = t == 0 ? a.k : reinterpret_cast<const uint16_t*>(a.slot[t & 1]);
    const uint16_t* vb = t == 0 ? a.v : reinterpret_cast<const uint16_t*>(a.slot[t & 1] + a.kv_bytes);
    for (int item = b; item < a.items; item += a.G) attend_item<T>(a, item, kb, vb, t == 0, t + 1 == a.world, ks, vs);
    if (t >= 1) {  // done with slot t % 2 (attend_item ends with cp.async drained and __syncthreads())
      __syncthreads();
      if (threadIdx.x == 0) {
        __threadfence_system();
        st_release_sys(a.prev_flags + cdone_word(a, t) + b, a.epoch);
      }
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

template <typename T>
int launch(const cb_args* args, RingArgs& a, cudaStream_t stream) {
  int sms = 0, occ = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, ring_kernel<T>, kThreads, 0) != cudaSuccess) return 2;
  if (occ > kMaxBlocksPerSm) occ = kMaxBlocksPerSm;
  const int slots = sms * occ / ranks_per_gpu(args);
  int C = 0;
  if (a.world > 1) {
    C = slots / 32;
    if (C < 1) C = 1;
    if (C > 4) C = 4;
  }
  int G = slots - C;
  if (G > a.items) G = a.items;
  if (G < 1) return 5;
  if (static_cast<int64_t>(a.world) * (2 * C + G) > args->flag_words) return 5;
  a.C = C;
  a.G = G;
  ring_kernel<T><<<C + G, kThreads, 0, stream>>>(a);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}

}  // namespace

CB_ENTRY ring_attention(const cb_args* args, cudaStream_t stream) {
  if (args->dtype != CB_BFLOAT16 && args->dtype != CB_FLOAT16) return 1;
  const int world = args->world, rank = args->rank;
  const int64_t kvh = args->params[0];
  if (world < 1 || world > CB_MAX_RANKS || kvh < 1) return 1;
  if (args->aux_in_count[0] < kD * kvh || args->aux_in_count[0] % (kD * kvh) != 0) return 4;
  const int64_t n = args->aux_in_count[0] / (kD * kvh);
  if (args->count % (kD * n) != 0) return 4;
  const int64_t heads = args->count / (kD * n);
  if (heads < 1 || heads % kvh != 0 || args->aux_in_count[1] != args->aux_in_count[0] ||
      args->out_count != args->count || args->aux_out_count[0] != n * heads)
    return 4;

  RingArgs a{};
  a.n = n;
  a.heads = static_cast<int>(heads);
  a.kv_heads = static_cast<int>(kvh);
  a.group = static_cast<int>(heads / kvh);
  a.world = world;
  a.qtiles = static_cast<int>((n + kBM - 1) / kBM);
  a.items = a.qtiles * a.heads;
  a.kv_bytes = n * kvh * kD * 2;
  a.epoch = args->epoch;
  a.scale_log2 = 1.4426950408889634f / 8.f;  // log2(e) / sqrt(64)

  const int64_t state_bytes = static_cast<int64_t>(a.items) * kWarps * kState * 32 * 4;  // a multiple of 256
  const int64_t slot_bytes = (2 * a.kv_bytes + 255) / 256 * 256;
  if (state_bytes + 2 * slot_bytes > args->scratch_bytes) return 5;
  const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  char* own = static_cast<char*>(args->scratch);
  char* nxt = static_cast<char*>(args->peer_scratch[next]);
  if (nxt == nullptr || args->peer_flags[next] == nullptr || args->peer_flags[prev] == nullptr) return 1;
  a.q = static_cast<const uint16_t*>(args->in);
  a.k = static_cast<const uint16_t*>(args->aux_in[0]);
  a.v = static_cast<const uint16_t*>(args->aux_in[1]);
  a.out = static_cast<uint16_t*>(args->out);
  a.lse = static_cast<uint16_t*>(args->aux_out[0]);
  a.state = reinterpret_cast<float*>(own);
  for (int s = 0; s < 2; ++s) {
    a.slot[s] = own + state_bytes + s * slot_bytes;
    a.next_slot[s] = nxt + state_bytes + s * slot_bytes;  // the same layout on every rank
  }
  a.flags = args->flags;
  a.prev_flags = args->peer_flags[prev];
  a.next_flags = args->peer_flags[next];
  return args->dtype == CB_BFLOAT16 ? launch<__nv_bfloat16>(args, a, stream) : launch<__half>(args, a, stream);
}
