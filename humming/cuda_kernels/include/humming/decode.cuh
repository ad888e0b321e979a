// Small-M weight-only GEMM ("decode"): out[M, N] = x[M, K] @ dequant(W[N, K])^T, M <= 64.
//
// Memory-bound on the weights, so the kernel is shaped around reading them once at full bandwidth:
// - the weights are in the fragment layout (humming/cuda_kernels/_layout.py): one warp reads one 16-row x
//   64-column chunk as one coalesced 512-byte access, 16 bytes per lane, and each lane's 16 bytes are
//   exactly its A fragments of four m16n8k16 mma.sync (weights are A, tokens are B: the kernel computes
//   out^T);
// - codes become 16-bit floats in registers with magic-number tricks: a 4-bit code ORed into the
//   mantissa of 128.0 (bf16) or 1024.0 (fp16) with one lop3, then one fma subtracts magic + zero point;
//   8-bit codes go through prmt into fp32 (8388608.0 + code) or fp16 (1024.0 + code);
// - each chunk's mma products (exact integers times activations, fp32 accumulate) are scaled per row in
//   fp32, so any group size that is a multiple of 64 works and the scale is applied in full precision;
// - each thread streams its weight fragments, scale and zero pairs through a private multi-stage
//   cp.async pipeline in shared memory, and each warp its activation chunk (read back with ldmatrix),
//   so many chunks are in flight per SM without holding registers;
// - warps of a block split K and reduce through shared memory; split-K across blocks (kSplit) adds into
//   an fp32 output with atomics for shapes with too few row tiles to fill the GPU.
#include "humming/dequant.cuh"

namespace humming {
namespace decode {

struct Params {
  const uint4* qweight;  // [N/16/TG, K/64, TG, 32 lanes, 4 words] (4-bit), [.., TG, 2, 32, 4] (8-bit)
  const void* x;         // [M, K] activations, row stride x_stride elements
  const void* scales;    // [N/16/TG, groups, TG, 8, 2]: rows (g, g+8) of each 16-row tile side by side
  const uint16_t* zeros; // [N/16/TG, groups, TG, 8, 2] zero points in code units, or null
  const void* bias;      // [N] (dtype B) or null
  void* out;             // [M, N], row stride out_stride elements
  int M, N, K;
  int x_stride, out_stride;
  int groups;            // scale groups along K
  int group_shift;       // log2(group size / 64), or 31 when there is one group
  int chunks_per_split;  // K/64 chunks handled by one blockIdx.y
  int tile_group;        // 16-row tiles per contiguous block of the layout
};

// kZero >= 0: every zero point is kZero; kZero < 0: zero points come from p.zeros.
// kMT token tiles of 8 (M <= 8 * kMT); kR 16-row tiles per warp; kStages chunks in flight per thread.
//
// Each thread runs a cp.async pipeline: it copies its own weight fragments, scale and zero pairs, and
// its share of its warp's activation chunk, for chunk i + kStages - 1 into shared memory, then waits for
// chunk i and computes on it. Weight, scale and zero slots are private to the thread; the activation
// slot is private to the warp (a __syncwarp orders it), so the pipeline needs no block barrier, and the
// bytes in flight do not occupy registers.
template <DType A, int kBits, int kZero, DType S, DType O, DType B, int kMT, int kR, int kWarps, int kStages,
          bool kSplit>
__device__ __forceinline__ void run(const Params& p) {
  constexpr int kVecs = kBits / 4;  // 16-byte weight vectors per lane per chunk and row tile
  constexpr int kThreads = kWarps * 32;
  constexpr int kScaleBytes = S == DType::f32 ? 8 : 4;  // the pair (row g, row g + 8)
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int tile0 = blockIdx.x * kR;
  const int n_chunks = p.K / 64;
  const int chunk_begin = blockIdx.y * p.chunks_per_split;
  const int chunk_end = min(n_chunks, chunk_begin + p.chunks_per_split);
  // Magic constant plus zero point, subtracted from the magic-number floats.
  constexpr float kMagicF = kBits == 8 && A == DType::bf16 ? 8388608.0f : (A == DType::bf16 ? 128.0f : 1024.0f);

  // Per-stage slots, [stage][item][thread] so that a warp's accesses are contiguous. Dynamic shared
  // memory: kStages * kThreads * (kR * kVecs * 16 + kMT * 32 + kR * 8 + kR * 4) bytes
  // (DecodeTuning.smem_bytes in decode.py).
  extern __shared__ uint4 smem[];
  uint4* w_slots = smem;                                        // [kStages][kR * kVecs][kThreads]
  uint4* x_slots = w_slots + kStages * kR * kVecs * kThreads;   // [kStages][kWarps][kMT * 8 tokens][8]
  uint2* s_slots = reinterpret_cast<uint2*>(x_slots + kStages * kMT * 2 * kThreads);  // [kStages][kR][kThreads]
  uint32_t* z_slots = reinterpret_cast<uint32_t*>(s_slots + kStages * kR * kThreads);  // [kStages][kR][kThreads]

  // Copy cursors of this thread, at the first chunk it issues, advanced by one chunk per issue
  // (chunks first, first + kWarps, ...): only pointer increments per chunk, no index arithmetic.
  const int first = chunk_begin + warp;
  constexpr int kStrideChunks = kWarps;
  const uint4* w_src[kR];
  const char* s_src[kR];
  const char* z_src[kR];
  long group_stride_s, group_stride_z;
  {
    const long tile_group = p.tile_group;
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const long blk = (tile0 + r) / tile_group, t = (tile0 + r) % tile_group;
      w_src[r] = p.qweight + ((blk * n_chunks + first) * tile_group + t) * kVecs * 32 + lane;
      const long pair = (blk * p.groups * tile_group + t) * 8 + g;  // the (g, g + 8) pair of group 0
      s_src[r] = static_cast<const char*>(p.scales) + pair * kScaleBytes;
      z_src[r] = reinterpret_cast<const char*>(p.zeros) + pair * 4;
    }
    group_stride_s = tile_group * 8 * kScaleBytes;
    group_stride_z = tile_group * 8 * 4;
  }
  const long w_step = long(kStrideChunks) * p.tile_group * kVecs * 32;
  // The warp's activation chunk: kMT * 8 token rows x 64 columns in 16-byte granules; lane copies
  // granules q = lane + 32 i; granule gran of row `row` is stored at gran ^ (row & 7), so that
  // ldmatrix reads are conflict-free. Rows past M are zero-filled (nothing read).
  const char* x_src[kMT * 2];
  uint32_t x_dst[kMT * 2];
  bool x_ok[kMT * 2];
#pragma unroll
  for (int i = 0; i < kMT * 2; ++i) {
    const int q = lane + 32 * i;
    const int row = q >> 3, gran = q & 7;
    x_ok[i] = row < p.M;
    x_src[i] = static_cast<const char*>(p.x) + (long(x_ok[i] ? row : 0) * p.x_stride + first * 64 + gran * 8) * 2;
    x_dst[i] = (row * 8 + (gran ^ (row & 7))) * 16;
  }
  const uint32_t smem_base = smem_addr(smem);
  const uint32_t w_base = smem_base + threadIdx.x * 16;
  const uint32_t x_base = smem_base + kStages * kR * kVecs * kThreads * 16 + warp * kMT * 1024;
  const uint32_t s_base = smem_base + kStages * (kR * kVecs + kMT * 2) * kThreads * 16 + threadIdx.x * 8;
  const uint32_t z_base = s_base - threadIdx.x * 8 + kStages * kR * kThreads * 8 + threadIdx.x * 4;
  int next = first;  // the chunk the next issue copies

  auto issue = [&](int stage) {
    if (next < chunk_end) {
      const long group = next >> p.group_shift;
#pragma unroll
      for (int r = 0; r < kR; ++r) {
#pragma unroll
        for (int v = 0; v < kVecs; ++v) {
          cp_async_cg16(w_base + ((stage * kR + r) * kVecs + v) * kThreads * 16, w_src[r] + v * 32);
        }
        cp_async_ca<kScaleBytes>(s_base + (stage * kR + r) * kThreads * 8, s_src[r] + group * group_stride_s);
        if constexpr (kZero < 0) {
          cp_async_ca<4>(z_base + (stage * kR + r) * kThreads * 4, z_src[r] + group * group_stride_z);
        }
        w_src[r] += w_step;
      }
#pragma unroll
      for (int i = 0; i < kMT * 2; ++i) {
        cp_async_ca16_zfill(x_base + stage * kWarps * kMT * 1024 + x_dst[i], x_src[i], x_ok[i]);
        x_src[i] += kStrideChunks * 128;
      }
    }
    next += kStrideChunks;
    cp_async_commit();  // empty groups past the end keep the group count uniform
  };

  float acc[kR][kMT][4];
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int t = 0; t < kMT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][t][i] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  int stage = 0;
  for (int chunk = first; chunk < chunk_end; chunk += kWarps) {
    __syncwarp();  // every lane is done reading the slot the next issue overwrites
    issue(stage == 0 ? kStages - 1 : stage - 1);
    cp_async_wait<kStages - 1>();
    __syncwarp();  // the warp's activation chunk, copied by all its lanes, is complete
    // B fragments: xb[t][j] = {b0, b1} of k16 step j for token tile t, two steps per ldmatrix.x4.
    uint32_t xb[kMT][4][2];
    const uint4* xs = x_slots + (stage * kWarps + warp) * kMT * 64;
#pragma unroll
    for (int t = 0; t < kMT; ++t)
#pragma unroll
      for (int jp = 0; jp < 2; ++jp) {
        const int row = t * 8 + (lane & 7);
        const int gran = 4 * jp + (lane >> 3);  // matrices: (2jp, lo), (2jp, hi), (2jp+1, lo), (2jp+1, hi)
        ldmatrix_x4(&xs[row * 8 + (gran ^ (row & 7))], xb[t][2 * jp][0], xb[t][2 * jp][1], xb[t][2 * jp + 1][0],
                    xb[t][2 * jp + 1][1]);
      }
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      uint4 wv[kVecs];
#pragma unroll
      for (int v = 0; v < kVecs; ++v) wv[v] = w_slots[(stage * kR * kVecs + r * kVecs + v) * kThreads + threadIdx.x];
      const uint2 sp = s_slots[(stage * kR + r) * kThreads + threadIdx.x];
      float s_g, s_g8;
      if constexpr (S == DType::f32) {
        s_g = __uint_as_float(sp.x);
        s_g8 = __uint_as_float(sp.y);
      } else {
        s_g = to_float<S>(uint16_t(sp.x & 0xffff));
        s_g8 = to_float<S>(uint16_t(sp.x >> 16));
      }
      float zf_g = kMagicF + kZero, zf_g8 = kMagicF + kZero;
      if constexpr (kZero < 0) {
        const uint32_t zp = z_slots[(stage * kR + r) * kThreads + threadIdx.x];
        zf_g = kMagicF + float(zp & 0xffff);
        zf_g8 = kMagicF + float(zp >> 16);
      }
      const uint32_t bias_g = pack2<A>(-zf_g, -zf_g);
      const uint32_t bias_g8 = pack2<A>(-zf_g8, -zf_g8);
      float part[kMT][4];
#pragma unroll
      for (int t = 0; t < kMT; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) part[t][i] = 0.0f;
      const uint32_t* words = reinterpret_cast<const uint32_t*>(&wv[0]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t a[4];
        if constexpr (kBits == 4) {
          dequant4<A>(words[j], bias_g, bias_g8, a);
        } else {
          // words[0..3] are mmas 0-1 and words[4..7] mmas 2-3, two words per mma.
          dequant8<A>(words[(j >> 1) * 4 + (j & 1) * 2], words[(j >> 1) * 4 + (j & 1) * 2 + 1], zf_g, zf_g8,
                      bias_g, bias_g8, a);
        }
#pragma unroll
        for (int t = 0; t < kMT; ++t) mma_16816<A>(part[t], a, xb[t][j][0], xb[t][j][1]);
      }
#pragma unroll
      for (int t = 0; t < kMT; ++t) {
        acc[r][t][0] += s_g * part[t][0];
        acc[r][t][1] += s_g * part[t][1];
        acc[r][t][2] += s_g8 * part[t][2];
        acc[r][t][3] += s_g8 * part[t][3];
      }
    }
    stage = stage + 1 == kStages ? 0 : stage + 1;
  }
  cp_async_wait<0>();

  // Reduce the warps' partial sums in shared memory, then write (or atomically add) the tile.
  constexpr int kTileValues = kR * kMT * 32 * 4;
  __shared__ float red[kTileValues];
  for (int i = threadIdx.x; i < kTileValues; i += kThreads) red[i] = 0.0f;
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int t = 0; t < kMT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) atomicAdd(&red[((r * kMT + t) * 32 + lane) * 4 + i], acc[r][t][i]);
  __syncthreads();
  for (int idx = threadIdx.x; idx < kTileValues; idx += kThreads) {
    const int i = idx & 3;
    const int l = (idx >> 2) & 31;
    const int t = (idx >> 7) % kMT;
    const int r = (idx >> 7) / kMT;
    const int token = t * 8 + (l & 3) * 2 + (i & 1);
    const int n = (tile0 + r) * 16 + (l >> 2) + (i >> 1) * 8;
    if (token >= p.M) continue;
    float v = red[idx];
    if (p.bias != nullptr && blockIdx.y == 0) v += load_float<B>(p.bias, n);
    const long o = long(token) * p.out_stride + n;
    if constexpr (kSplit) {
      atomicAdd(static_cast<float*>(p.out) + o, v);
    } else {
      store_float<O>(p.out, o, v);
    }
  }
}

}  // namespace decode
}  // namespace humming
