// Reference: a fused MoE router. One kernel per rank reads each token's E logits once and writes its top-k expert
// ids, their gates, its row of is_token_in_rank, and its share of tokens_per_rank / tokens_per_expert; nothing
// (not the top-k ids) goes back through global memory before the layout is known.
//
// One warp per token, two tokens per warp at a time (both rows loaded before either is ranked, so two 16-byte
// loads per lane are in flight). Lane l holds experts [l V, (l + 1) V), V = the power of two >= E / 32, as sort
// keys: the logit's bits in an order-preserving unsigned form above (max index - e), so that a larger key is a
// larger logit or, for equal logits, a smaller index, and all keys of a row differ. A 16-bit logit and its index
// fit in 32 bits (one __reduce_max_sync per comparison across the warp); a float32 logit needs 64 bits. Each lane
// sorts its V keys (a bitonic network in registers); then k rounds of: the warp's largest head key
// (__reduce_max_sync) is the next expert, and the lane that holds it shifts its list. The first winner is the
// row's maximum, so the softmax needs no other pass: with normalize = 1 the gates are exp(l - max) over the k
// chosen logits (k lanes, one expf each) divided by their sum; with normalize = 0 every lane first sums
// exp(l - max) over its V logits.
//
// Layout in the same pass: the owners of the k chosen experts OR into a rank mask (__reduce_or_sync), whose bits
// are the token's is_token_in_rank row and count into per-lane tokens_per_rank registers; the chosen experts
// count into a shared-memory histogram. Every block adds its histogram and rank counts into an accumulator in
// scratch with global atomics, then takes a ticket; the block that takes the last ticket reads the accumulator
// with atomicExch (reading it and zeroing it for the next call in one step) into tokens_per_expert and
// tokens_per_rank, and resets the ticket counter. Scratch is zeroed before a case's first call and every call
// leaves it zeroed, so no call needs a zeroing pass or a second kernel. No block ever waits for another.
//
// Bound: the benchmark (bfloat16, E = 256, k = 8) reads 512 bytes of logits per token and writes 64 + 16 + world
// bytes, so HBM alone would allow about 1.7x the copy roofline (the metric counts the logits once; a copy moves
// every byte twice). The ranking costs about 150-200 warp instructions per token (8 keys per lane, a 24-compare
// sort, 8 rounds of reduce-and-shift, key decoding), which caps the kernel near 4-6 G tokens/s on an H200, about
// 1 to 1.5x the copy roofline: compute, not HBM, is the limit, and 70 % of the copy roofline is the target.
#include "commbench.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxExperts = 1024;
constexpr unsigned kFull = 0xffffffffu;

struct RouterArgs {
  const void* logits;          // [T, E]
  int64_t* topk_idx;           // [T, k]
  void* topk_w;                // [T, k], the logits' dtype
  uint8_t* in_rank;            // [T, world] bool
  int32_t* tokens_per_rank;    // [world]
  int32_t* tokens_per_expert;  // [E]
  unsigned* ticket;            // scratch word 0
  int32_t* acc;                // scratch words 1 .. E + world: [E] per expert, then [world] per rank
  int64_t tokens;
  int experts, epr, k, world, normalize, vec;
};

// ---- per dtype: raw bits, keys, conversions ----------------------------------------------------------------------
template <typename T> struct Traits;
template <> struct Traits<float> {
  using Bits = uint32_t;
  using Key = unsigned long long;
  __device__ static float to_float(Bits b) { return __uint_as_float(b); }
  __device__ static void store(void* p, int64_t i, float v) { static_cast<float*>(p)[i] = v; }
  __device__ static Key key(Bits b, int e) {
    const uint32_t ord = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return (static_cast<Key>(ord) << 32) | static_cast<Key>(0xffffffffu - static_cast<uint32_t>(e));
  }
  __device__ static int index(Key k) { return static_cast<int>(0xffffffffu - static_cast<uint32_t>(k)); }
  __device__ static Bits bits(Key k) {
    const uint32_t ord = static_cast<uint32_t>(k >> 32);
    return (ord & 0x80000000u) ? (ord & 0x7fffffffu) : ~ord;
  }
};
template <> struct Traits<__nv_bfloat16> {
  using Bits = uint16_t;
  using Key = uint32_t;
  __device__ static float to_float(Bits b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }
  __device__ static void store(void* p, int64_t i, float v) { static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); }
  __device__ static Key key(Bits b, int e) {
    const uint32_t ord = (b & 0x8000u) ? (~static_cast<uint32_t>(b) & 0xffffu) : (static_cast<uint32_t>(b) | 0x8000u);
    return (ord << 16) | (0xffffu - static_cast<uint32_t>(e));
  }
  __device__ static int index(Key k) { return static_cast<int>(0xffffu - (k & 0xffffu)); }
  __device__ static Bits bits(Key k) {
    const uint32_t ord = k >> 16;
    return static_cast<Bits>((ord & 0x8000u) ? (ord & 0x7fffu) : (~ord & 0xffffu));
  }
};
template <> struct Traits<__half> {
  using Bits = uint16_t;
  using Key = uint32_t;
  __device__ static float to_float(Bits b) { return __half2float(__ushort_as_half(b)); }
  __device__ static void store(void* p, int64_t i, float v) { static_cast<__half*>(p)[i] = __float2half_rn(v); }
  __device__ static Key key(Bits b, int e) { return Traits<__nv_bfloat16>::key(b, e); }
  __device__ static int index(Key k) { return Traits<__nv_bfloat16>::index(k); }
  __device__ static Bits bits(Key k) { return Traits<__nv_bfloat16>::bits(k); }
};

__device__ __forceinline__ uint32_t warp_max(uint32_t k) { return __reduce_max_sync(kFull, k); }
__device__ __forceinline__ unsigned long long warp_max(unsigned long long k) {
  const uint32_t hi = __reduce_max_sync(kFull, static_cast<uint32_t>(k >> 32));
  const uint32_t lo = __reduce_max_sync(kFull, static_cast<uint32_t>(k >> 32) == hi ? static_cast<uint32_t>(k) : 0u);
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// V keys of one lane, sorted descending in registers (bitonic network; V a power of two)
template <int V, typename K>
__device__ __forceinline__ void sort_desc(K (&k)[V]) {
#pragma unroll
  for (int size = 2; size <= V; size <<= 1) {
#pragma unroll
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const int j = i ^ stride;
        if (j > i) {
          const bool desc = (i & size) == 0;
          const K a = k[i], b = k[j];
          const K hi = a > b ? a : b, lo = a > b ? b : a;
          k[i] = desc ? hi : lo;
          k[j] = desc ? lo : hi;
        }
      }
    }
  }
}

// One lane's V logits of a row as raw words: V * sizeof(T) bytes, loaded with the widest access that divides it
template <int B> struct Chunk { uint4 w[B / 16]; };
template <> struct Chunk<8> { uint2 w[1]; };
template <> struct Chunk<4> { uint32_t w[1]; };
template <> struct Chunk<2> { uint16_t w[1]; };

template <typename T, int V>
union Lane {
  Chunk<V * static_cast<int>(sizeof(T))> c;
  typename Traits<T>::Bits b[V];
};

template <typename T, int V>
__device__ __forceinline__ Lane<T, V> load_lane(const T* row, int lane) {
  using C = Chunk<V * static_cast<int>(sizeof(T))>;
  Lane<T, V> u;
  u.c = *reinterpret_cast<const C*>(row + static_cast<int64_t>(lane) * V);
  return u;
}

// The k experts of one token (keys in `key`, consumed), its gates and layout; `rank_cnt`: this lane's count of
// tokens for rank `lane` (lanes < world).
template <typename T, int V>
__device__ __forceinline__ void route(const RouterArgs& a, int64_t t, typename Traits<T>::Key (&key)[V], int lane,
                                      int* hist, int& rank_cnt) {
  using Tr = Traits<T>;
  using Key = typename Tr::Key;
  sort_desc<V>(key);
  const Key top = warp_max(key[0]);
  const float lmax = Tr::to_float(Tr::bits(top));
  float denom_part = 0.f;
  if (!a.normalize) {  // warp-uniform: the softmax over all E logits
#pragma unroll
    for (int j = 0; j < V; ++j)
      if (key[j] != 0) denom_part += __expf(Tr::to_float(Tr::bits(key[j])) - lmax);
  }
  Key mine = 0;
  for (int r = 0; r < a.k; ++r) {
    const Key w = r == 0 ? top : warp_max(key[0]);
    if (lane == r) mine = w;
    const bool win = key[0] == w;  // exactly one lane: keys are distinct
#pragma unroll
    for (int j = 0; j + 1 < V; ++j) key[j] = win ? key[j + 1] : key[j];
    key[V - 1] = win ? Key(0) : key[V - 1];
  }
  const bool chosen = lane < a.k;
  const int e = chosen ? Tr::index(mine) : 0;
  const float p = chosen ? expf(Tr::to_float(Tr::bits(mine)) - lmax) : 0.f;
  const float denom = a.normalize ? warp_sum(p) : warp_sum(denom_part);
  const unsigned owner_bit = chosen ? 1u << (e / a.epr) : 0u;
  const unsigned mask = __reduce_or_sync(kFull, owner_bit);
  if (chosen) {
    a.topk_idx[t * a.k + lane] = e;
    Tr::store(a.topk_w, t * a.k + lane, p / denom);
    atomicAdd(&hist[e], 1);
  }
  if (lane < a.world) {
    const unsigned hit = (mask >> lane) & 1u;
    a.in_rank[t * a.world + lane] = static_cast<uint8_t>(hit);
    rank_cnt += static_cast<int>(hit);
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads, (V * sizeof(typename Traits<T>::Key) <= 32) ? 2 : 1)
router_kernel(const __grid_constant__ RouterArgs a) {
  using Tr = Traits<T>;
  using Key = typename Tr::Key;
  __shared__ int hist[kMaxExperts];
  __shared__ int rank_s[CB_MAX_RANKS];
  __shared__ bool last;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int e = tid; e < a.experts; e += kThreads) hist[e] = 0;
  if (tid < CB_MAX_RANKS) rank_s[tid] = 0;
  __syncthreads();

  const T* logits = static_cast<const T*>(a.logits);
  const int64_t gwarp = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * kWarps;
  int rank_cnt = 0;
  if (a.vec) {  // E == 32 V: lane l's logits are one aligned run of V * sizeof(T) bytes
    for (int64_t pair = gwarp; 2 * pair < a.tokens; pair += nwarps) {
      const int64_t t0 = 2 * pair;
      const bool two = t0 + 1 < a.tokens;
      const Lane<T, V> u0 = load_lane<T, V>(logits + t0 * a.experts, lane);
      const Lane<T, V> u1 = load_lane<T, V>(logits + (two ? t0 + 1 : t0) * a.experts, lane);  // both in flight
      Key key[V];
#pragma unroll
      for (int j = 0; j < V; ++j) key[j] = Tr::key(u0.b[j], lane * V + j);
      route<T, V>(a, t0, key, lane, hist, rank_cnt);
      if (two) {  // warp-uniform
#pragma unroll
        for (int j = 0; j < V; ++j) key[j] = Tr::key(u1.b[j], lane * V + j);
        route<T, V>(a, t0 + 1, key, lane, hist, rank_cnt);
      }
    }
  } else {  // any E: element loads, keys of 0 (below every logit) past E
    const typename Tr::Bits* bits = static_cast<const typename Tr::Bits*>(a.logits);
    for (int64_t t = gwarp; t < a.tokens; t += nwarps) {
      Key key[V];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int e = lane * V + j;
        key[j] = e < a.experts ? Tr::key(bits[t * a.experts + e], e) : Key(0);
      }
      route<T, V>(a, t, key, lane, hist, rank_cnt);
    }
  }

  // this block's counts into the accumulator, then a ticket; the last block publishes and clears
  if (lane < a.world && rank_cnt != 0) atomicAdd(&rank_s[lane], rank_cnt);
  __syncthreads();
  for (int e = tid; e < a.experts; e += kThreads)
    if (hist[e] != 0) atomicAdd(&a.acc[e], hist[e]);
  if (tid < a.world && rank_s[tid] != 0) atomicAdd(&a.acc[a.experts + tid], rank_s[tid]);
  __threadfence();  // every thread's atomics are performed before the ticket below
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    last = atomicAdd(a.ticket, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int e = tid; e < a.experts; e += kThreads) a.tokens_per_expert[e] = atomicExch(&a.acc[e], 0);
  if (tid < a.world) a.tokens_per_rank[tid] = atomicExch(&a.acc[a.experts + tid], 0);
  if (tid == 0) atomicExch(a.ticket, 0u);  // every block has taken its ticket: ready for the next call
}

template <typename T, int V>
void launch(const RouterArgs& a, int grid, cudaStream_t stream) {
  router_kernel<T, V><<<grid, kThreads, 0, stream>>>(a);
}

template <typename T>
int launch_for(const RouterArgs& a, int v, int grid, cudaStream_t stream) {
  switch (v) {
    case 1: launch<T, 1>(a, grid, stream); break;
    case 2: launch<T, 2>(a, grid, stream); break;
    case 4: launch<T, 4>(a, grid, stream); break;
    case 8: launch<T, 8>(a, grid, stream); break;
    case 16: launch<T, 16>(a, grid, stream); break;
    case 32: launch<T, 32>(a, grid, stream); break;
    default: return 1;
  }
  return 0;
}

}  // namespace

CB_ENTRY router_topk_layout(const cb_args* args, cudaStream_t stream) {
  const int world = args->world;
  const int64_t epr = args->params[0], k = args->params[1], normalize = args->params[2];
  if (world < 1 || world > CB_MAX_RANKS || epr < 1 || k < 1 || k > 32 || (normalize != 0 && normalize != 1)) return 1;
  const int64_t experts = world * epr;
  if (experts > kMaxExperts || k > experts || args->count % experts != 0) return 1;
  const int64_t tokens = args->count / experts;
  if (args->out_count != tokens * k || args->aux_out_count[0] != tokens * k ||
      args->aux_out_count[1] != tokens * world || args->aux_out_count[2] != world ||
      args->aux_out_count[3] != experts)
    return 4;
  if (args->scratch_bytes < 4 * (1 + experts + world)) return 6;

  int v = 1;
  while (32 * v < experts) v <<= 1;
  const int64_t esz = args->dtype == CB_FLOAT32 ? 4 : 2;
  RouterArgs a{};
  a.logits = args->in;
  a.topk_idx = static_cast<int64_t*>(args->out);
  a.topk_w = args->aux_out[0];
  a.in_rank = static_cast<uint8_t*>(args->aux_out[1]);
  a.tokens_per_rank = static_cast<int32_t*>(args->aux_out[2]);
  a.tokens_per_expert = static_cast<int32_t*>(args->aux_out[3]);
  a.ticket = static_cast<unsigned*>(args->scratch);
  a.acc = static_cast<int32_t*>(args->scratch) + 1;
  a.tokens = tokens;
  a.experts = static_cast<int>(experts);
  a.epr = static_cast<int>(epr);
  a.k = static_cast<int>(k);
  a.world = world;
  a.normalize = static_cast<int>(normalize);
  const int64_t lane_bytes = v * esz;
  a.vec = experts == 32 * v && lane_bytes >= 2 && reinterpret_cast<uintptr_t>(args->in) % (lane_bytes < 16 ? lane_bytes : 16) == 0;

  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, args->device) != cudaSuccess) return 2;
  int64_t grid = (tokens + 2 * kWarps - 1) / (2 * kWarps);  // two tokens per warp per round
  if (grid > 2 * sms) grid = 2 * sms;
  if (grid < 1) grid = 1;

  int rc;
  switch (args->dtype) {
    case CB_FLOAT32: rc = launch_for<float>(a, v, static_cast<int>(grid), stream); break;
    case CB_BFLOAT16: rc = launch_for<__nv_bfloat16>(a, v, static_cast<int>(grid), stream); break;
    case CB_FLOAT16: rc = launch_for<__half>(a, v, static_cast<int>(grid), stream); break;
    default: return 1;
  }
  if (rc != 0) return rc;
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
