// Small-M weight-only GEMM ("decode"): out[M, N] = x[M, K] @ dequant(W[N, K])^T, M <= 64.
//
// Memory-bound on the weights, so the kernel is shaped around reading them once at full bandwidth:
// - the weights are in the fragment layout (humming/cuda_kernels/_layout.py): one warp reads one 16-row x
//   64-column chunk as one coalesced 512-byte access, 16 bytes per lane, and each lane's 16 bytes are
//   exactly its A fragments of four m16n8k16 mma.sync (weights are A, tokens are B: the kernel computes
//   out^T);
// - codes become 16-bit floats in registers with magic-number tricks: a 4-bit code ORed into the
//   mantissa of 128.0 (bf16) or 1024.0 (fp16) with one lop3, then one fma subtracts magic + zero point;
//   8-bit codes go through prmt into fp32 (8388608.0 + code) or fp16 (1024.0 + code); e2m1 codes (MXFP4)
//   are placed into the bits of a 16-bit float and multiplied by a power of two (dequant_e2m1);
// - each chunk's mma products (exact integers times activations, fp32 accumulate) are scaled per row in
//   fp32, so any group size that is a multiple of 64 works and the scale is applied in full precision;
//   groups of 32 (MXFP4's e8m0 scales, one byte made fp32 exactly; integer codes' 16-bit scales, S =
//   bf16_halves / f16_halves) are the two halves of a chunk, each scale applied to the partial sum of
//   its half's two k16 steps;
// - each thread streams its weight fragments, scale and zero pairs through a private multi-stage
//   cp.async pipeline in shared memory, and each warp its activation chunk (read back with ldmatrix),
//   so many chunks are in flight per SM without holding registers;
// - launched behind humming's activation pass (programmatic launch, sm_90+), the tiles schedule copies its
//   first chunks' weights before grid_dependency_wait and their activations after it, so that the weight
//   stream starts while the pass runs; the grouped variant waits before anything (it is launched
//   programmatically behind any kernel). Every variant lets the kernel launched behind it start at once.
//
// Three schedules of the same per-chunk work (Schedule):
// - tiles: one block per kR row tiles; its warps split K round-robin and reduce in shared memory;
// - split_k: the same, with blockIdx.y splitting K too (for shapes with too few row tiles to fill the GPU):
//   the blocks add into an fp32 output (O = f32) that the host zeroes and rounds; split_k_read_back (the
//   default with one token tile, DecodeTuning.reads_back): they add into an fp32 workspace with red.add and
//   the tile's last block to arrive writes the output, leaving the workspace and its counter at zero (as
//   stream_k does: no memset, no rounding pass);
// - stream_k: a persistent grid (blocks per SM x SMs). The work units (row tile group, 64-column chunk)
//   are flattened tile-major and each warp takes one contiguous range of them, so every warp moves the
//   same bytes whatever the shape: no partial last wave, and one pipeline ramp per warp rather than per
//   block. A warp's pipeline runs across tile boundaries; its partial sums of a tile go to an fp32
//   workspace with red.add, and the warp that arrives last at the tile's counter writes the tile and
//   leaves the workspace and counter at zero again (no memset per call).
//
// Grouped (MoE) variant of the tiles schedule, kGrouped: the weights hold E experts stacked along rows
// (expert e's 16-row tile t is tile e * N / 16 + t of the layout, likewise scales and zero points; bias is
// [E, N]); out has M = M_pad grouped rows, in segments of block_m rows, expert_ids[s] the expert of segment s
// (outside [0, num_experts), as -1 or an out-of-range routing id: unused, not written). Grouped row r reads
// x row rows[r] (the tokens [T, K], read in place; -1: a padding row, zeros) or, without rows, x row r. A
// block takes kR row tiles (blockIdx.x) of units of kMT * 8 grouped rows (which divide block_m): units
// blockIdx.y, blockIdx.y + gridDim.y, ...; its warps find the used ones 32 at a time with one ballot, so a
// grid sized for the used units (a decode call uses a few of the worst case's segments) skips the rest
// without launching blocks for them, and a smaller grid is still exact.
// kAct (gated epilogue): the weights are fused_moe's w13 in gate-up order (gate_up_rows in _layout.py: row g
// of each 16-row tile is the gate of a feature, row g + 8 its up), out is [M, N / 2]: act(gate, up), each
// rounded to O first as the unfused GEMM's output would be.
#include "humming/dequant.cuh"

namespace humming {
namespace decode {

struct Params {
  const uint4* qweight;  // [N/16/TG, K/64, TG, 32 lanes, 4 words] (4-bit), [.., TG, 2, 32, 4] (8-bit)
  const void* x;         // [M, K] activations, row stride x_stride elements
  const void* scales;    // [N/16/TG, groups, TG, 8, 2]: rows (g, g+8) of each 16-row tile side by side;
                         // e2m1: [N/16/TG, K/64, TG, 8, 2 halves, 2] e8m0 bytes
  const uint16_t* zeros; // [N/16/TG, groups, TG, 8, 2] zero points in code units, or null
  const void* bias;      // [N] (dtype B) or null
  void* out;             // [M, N], row stride out_stride elements
  int M, N, K;
  int x_stride, out_stride;
  int groups;            // scale groups along K
  int group_shift;       // log2(group size / 64), or 31 when there is one group
  int chunks_per_split;  // K/64 chunks handled by one blockIdx.y (split_k)
  int tile_group;        // 16-row tiles per contiguous block of the layout
  float* sums;           // stream_k, split_k: [M, N] fp32 partial sums, all zero between calls
  int* arrivals;         // stream_k, split_k: [N / 16 / kR] arrival counters, all zero between calls
  int total_warps;       // stream_k: warps of the persistent grid (W)
  const float* x_scale;  // per-token (x_scale_stride 1) or per-tensor (0) activation scale, or null: x holds
  int x_scale_stride;    // quantized activations' values (fp8 schemes run through the 16-bit kernels)
  const int* expert_ids; // kGrouped: [M / block_m] expert of each segment, -1 (or >= num_experts) = unused
  const int* rows;       // kGrouped: [M] x row of each grouped row (-1: padding), or null: x holds grouped rows
  int block_m;           // kGrouped: grouped rows per expert_ids entry
  float act_alpha;       // kAct == kSwigluOai: the sigmoid's slope and the clamp bound
  float act_limit;
  int gate_up_interleaved;  // kAct: the bias's gate / up columns are 2f / 2f + 1 (else f / N / 2 + f)
  int num_experts;       // kGrouped: segments whose id is not in [0, num_experts) are unused
};

// The output value of `sum` (x row `token` times a W row whose bias is bias[bias_col]): times the
// activation scale, plus the bias.
template <DType B>
__device__ __forceinline__ float epilogue(const Params& p, int token, long bias_col, float sum, bool add_bias) {
  if (p.x_scale != nullptr) sum *= p.x_scale[token * p.x_scale_stride];
  if (add_bias && p.bias != nullptr) sum += load_float<B>(p.bias, bias_col);
  return sum;
}

enum class Schedule { tiles, split_k, split_k_read_back, stream_k };

// x, opaque to the compiler: what is computed from it inside a rarely taken branch stays there instead
// of being hoisted out of the loop into registers that the loop's hot path needs.
__device__ __forceinline__ int opaque(int x) {
  asm volatile("" : "+r"(x));
  return x;
}

// Token and output row of accumulator element acc[r][t][i] of lane `lane` (mma.sync's D fragment; the
// kernel computes out^T, so fragment rows are output rows and fragment columns tokens).
__device__ __forceinline__ int acc_token(int t, int lane, int i) { return t * 8 + (lane & 3) * 2 + (i & 1); }
__device__ __forceinline__ int acc_row(int tile0, int r, int lane, int i) {
  return (tile0 + r) * 16 + (lane >> 2) + (i >> 1) * 8;
}

// One thread's share of the cp.async pipeline and of the per-chunk math.
//
// Each thread copies its own weight fragments, scale and zero pairs, and its share of its warp's
// activation chunk, for chunk i + kStages - 1 into shared memory, then waits for chunk i and computes on
// it. Weight, scale and zero slots are private to the thread; the activation slot is private to the warp
// (a __syncwarp orders it), so the pipeline needs no block barrier, and the bytes in flight do not occupy
// registers. The copy cursors are pointers advanced by increments per chunk; only seek() (once per row
// tile group) does index arithmetic.
template <DType A, int kBits, bool kE2m1, int kZero, DType S, int kMT, int kR, int kWarps, int kStages>
struct Pipeline {
  static constexpr int kVecs = kBits / 4;  // 16-byte weight vectors per lane per chunk and row tile
  static constexpr int kThreads = kWarps * 32;
  // The pair (row g, row g + 8); e8m0 (e2m1 codes): two pairs of bytes, one per 32-column half of the chunk
  // (e8m0: every code of the weight is 1..254, a shift makes it fp32; e8m0_any: 0 and 255 are checked).
  // 16-bit scales of 32-column groups: (row g, row g + 8) of the chunk's first half, then of its second.
  static constexpr bool k16Halves = S == DType::bf16_halves || S == DType::f16_halves;
  static constexpr int kScaleBytes = S == DType::f32 || k16Halves ? 8 : 4;
  static constexpr bool kE8m0 = S == DType::e8m0 || S == DType::e8m0_any;
  static constexpr bool kHalves = kE8m0 || k16Halves;  // each 32-column half of a chunk has its own scale
  static_assert(kE2m1 == kE8m0 && (!kE2m1 || (kBits == 4 && kZero == 0)), "MXFP4: e2m1 codes with e8m0 scales");
  static_assert(!k16Halves || kZero >= 0, "32-column groups: constant zero points");
  // Magic constant plus zero point, subtracted from the magic-number floats.
  static constexpr float kMagicF =
      kBits == 8 && A == DType::bf16 ? 8388608.0f : (A == DType::bf16 ? 128.0f : 1024.0f);

  const int lane, warp;
  // Per-stage slots, [stage][item][thread] so that a warp's accesses are contiguous. Dynamic shared
  // memory: kStages * kThreads * (kR * kVecs * 16 + kMT * 32 + kR * 8 + kR * 4) bytes
  // (DecodeTuning.smem_bytes in _decode.py).
  const uint4* w_slots;   // [kStages][kR * kVecs][kThreads]
  const uint4* x_slots;   // [kStages][kWarps][kMT * 8 tokens][8]
  const uint2* s_slots;   // [kStages][kR][kThreads]
  const uint32_t* z_slots;  // [kStages][kR][kThreads]
  uint32_t w_base, x_base, s_base, z_base;

  const uint4* w_src[kR];
  const char* s_src[kR];
  const char* z_src[kR];
  int group_stride_s, group_stride_z;
  int w_step, x_step;  // cursor increments per issued chunk
  // The warp's activation chunk: kMT * 8 token rows x 64 columns in 16-byte granules; lane copies
  // granules q = lane + 32 i; granule gran of row `row` is stored at gran ^ (row & 7), so that
  // ldmatrix reads are conflict-free. Rows past M (grouped: padding rows) are zero-filled (nothing read).
  const char* x_src[kMT * 2];
  uint32_t x_dst[kMT * 2];
  int x_row[kMT * 2];  // the x row of each granule's token, -1: zeros
  bool x_ok[kMT * 2];

  // `stride_chunks`: chunks between two consecutive issues of this thread.
  __device__ __forceinline__ Pipeline(const Params& p, uint4* smem, int stride_chunks)
      : lane(threadIdx.x & 31), warp(threadIdx.x >> 5) {
    w_slots = smem;
    x_slots = w_slots + kStages * kR * kVecs * kThreads;
    s_slots = reinterpret_cast<const uint2*>(x_slots + kStages * kMT * 2 * kThreads);
    z_slots = reinterpret_cast<const uint32_t*>(s_slots + kStages * kR * kThreads);
    const uint32_t smem_base = smem_addr(smem);
    w_base = smem_base + threadIdx.x * 16;
    x_base = smem_base + kStages * kR * kVecs * kThreads * 16 + warp * kMT * 1024;
    const uint32_t s_start = smem_base + kStages * (kR * kVecs + kMT * 2) * kThreads * 16;
    s_base = s_start + threadIdx.x * 8;
    z_base = s_start + kStages * kR * kThreads * 8 + threadIdx.x * 4;
    group_stride_s = p.tile_group * 8 * kScaleBytes;
    group_stride_z = p.tile_group * 8 * 4;
    w_step = stride_chunks * p.tile_group * kVecs * 32;
    x_step = stride_chunks * 128;
#pragma unroll
    for (int i = 0; i < kMT * 2; ++i) {
      const int q = lane + 32 * i;
      const int row = q >> 3, gran = q & 7;
      x_row[i] = row < p.M ? row : -1;
      x_ok[i] = row < p.M;
      x_dst[i] = (row * 8 + (gran ^ (row & 7))) * 16;
    }
  }

  // Grouped: the tokens are grouped rows row0 .. row0 + kMT * 8 - 1 (x rows through p.rows, if any).
  __device__ __forceinline__ void set_rows(const Params& p, int row0) {
#pragma unroll
    for (int i = 0; i < kMT * 2; ++i) {
      const int grouped = row0 + ((lane + 32 * i) >> 3);
      x_row[i] = p.rows != nullptr ? __ldg(p.rows + grouped) : grouped;
      x_ok[i] = x_row[i] >= 0;
    }
  }

  // Point the copy cursors at chunk `chunk` of row tiles tile0 .. tile0 + kR - 1 (of the layout: grouped,
  // the expert's first tile plus the row tile).
  __device__ __forceinline__ void seek(const Params& p, int tile0, int chunk) {
    const long tile_group = p.tile_group, n_chunks = p.K / 64;
    const int g = lane >> 2;
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const long blk = (tile0 + r) / tile_group, t = (tile0 + r) % tile_group;
      w_src[r] = p.qweight + ((blk * n_chunks + chunk) * tile_group + t) * kVecs * 32 + lane;
      const long pair = (blk * p.groups * tile_group + t) * 8 + g;  // the (g, g + 8) pair of group 0
      s_src[r] = static_cast<const char*>(p.scales) + pair * kScaleBytes;
      z_src[r] = reinterpret_cast<const char*>(p.zeros) + pair * 4;
    }
#pragma unroll
    for (int i = 0; i < kMT * 2; ++i) {
      const int gran = (lane + 32 * i) & 7;
      x_src[i] = static_cast<const char*>(p.x) + (long(x_ok[i] ? x_row[i] : 0) * p.x_stride + chunk * 64 + gran * 8) * 2;
    }
  }

  // After the last chunk of a tile, move the cursors to chunk 0 of row tiles tile0 .. tile0 + kR - 1, the
  // next tile, with increments (kR divides the tile group, or the tile group is 1): within a block of
  // tile_group row tiles, or to the next block (kR blocks on when tile_group == 1).
  __device__ __forceinline__ void next_tile(const Params& p, int tile0) {
    const int tg = p.tile_group, n_chunks = p.K / 64;
    int w_delta, pair_delta;  // in chunk-sized weight slices and (g, g + 8) pairs
    if ((tile0 & (tg - 1)) != 0) {
      w_delta = kR - n_chunks * tg;
      pair_delta = kR;
    } else {
      const int blocks = tg == 1 ? kR : 1;
      w_delta = (blocks - 1) * n_chunks * tg + kR - blocks * tg;
      pair_delta = blocks * (p.groups - 1) * tg + kR;
    }
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      w_src[r] += w_delta * kVecs * 32;
      s_src[r] += pair_delta * 8 * kScaleBytes;
      z_src[r] += pair_delta * 8 * 4;
    }
#pragma unroll
    for (int i = 0; i < kMT * 2; ++i) x_src[i] -= n_chunks * 128;
  }

  // Copy the chunk under the cursors (scale group `group`) into `stage`, then advance the cursors.
  __device__ __forceinline__ void copy(int stage, int group) {
    copy_weights(stage, group);
    copy_x(stage);
  }

  // The weight part of copy: codes, scales and zero points.
  __device__ __forceinline__ void copy_weights(int stage, int group) {
    const int s_off = group * group_stride_s, z_off = group * group_stride_z;
#pragma unroll
    for (int r = 0; r < kR; ++r) {
#pragma unroll
      for (int v = 0; v < kVecs; ++v) {
        cp_async_cg16(w_base + ((stage * kR + r) * kVecs + v) * kThreads * 16, w_src[r] + v * 32);
      }
      cp_async_ca<kScaleBytes>(s_base + (stage * kR + r) * kThreads * 8, s_src[r] + s_off);
      if constexpr (kZero < 0) {
        cp_async_ca<4>(z_base + (stage * kR + r) * kThreads * 4, z_src[r] + z_off);
      }
      w_src[r] += w_step;
    }
  }

  // The activation part of copy.
  __device__ __forceinline__ void copy_x(int stage) {
#pragma unroll
    for (int i = 0; i < kMT * 2; ++i) {
      cp_async_ca_zfill<16>(x_base + stage * kWarps * kMT * 1024 + x_dst[i], x_src[i], x_ok[i]);
      x_src[i] += x_step;
    }
  }

  // Issues the first kStages - 1 chunks into stages 0 .. kStages - 2 (`issue(stage)` copies the next chunk
  // of the schedule and commits a group, empty past its end); returns the stage computed first.
  template <class Issue>
  __device__ __forceinline__ int prime(Issue& issue) const {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue(s);
    return 0;
  }

  // One step of the pipeline: refill the stage computed last step, wait for `stage`, acc += its chunk;
  // returns the stage of the next step.
  template <class Issue>
  __device__ __forceinline__ int step(int stage, Issue& issue, float (&acc)[kR][kMT][4]) const {
    __syncwarp();  // every lane is done reading the slot the next issue overwrites
    issue(stage == 0 ? kStages - 1 : stage - 1);
    cp_async_wait<kStages - 1>();
    __syncwarp();  // the warp's activation chunk, copied by all its lanes, is complete
    compute(stage, acc);
    return stage + 1 == kStages ? 0 : stage + 1;
  }

  // acc += the chunk in `stage` (its copies complete and visible to the warp).
  __device__ __forceinline__ void compute(int stage, float (&acc)[kR][kMT][4]) const {
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
      // Rows g and g + 8: the chunk's scale (e2m1: its first 32 columns' scale; the second's is s_hi_*).
      float s_g, s_g8, s_hi_g = 0.0f, s_hi_g8 = 0.0f;
      if constexpr (S == DType::f32) {
        s_g = __uint_as_float(sp.x);
        s_g8 = __uint_as_float(sp.y);
      } else if constexpr (S == DType::e8m0) {  // codes 1..254: the code is the fp32 exponent field
        s_g = __uint_as_float((sp.x << 23) & 0x7f800000u);
        s_g8 = __uint_as_float((sp.x << 15) & 0x7f800000u);
        s_hi_g = __uint_as_float((sp.x << 7) & 0x7f800000u);
        s_hi_g8 = __uint_as_float((sp.x >> 1) & 0x7f800000u);
      } else if constexpr (S == DType::e8m0_any) {
        s_g = e8m0_to_float(sp.x & 0xff);
        s_g8 = e8m0_to_float((sp.x >> 8) & 0xff);
        s_hi_g = e8m0_to_float((sp.x >> 16) & 0xff);
        s_hi_g8 = e8m0_to_float(sp.x >> 24);
      } else if constexpr (k16Halves) {
        constexpr DType H = S == DType::bf16_halves ? DType::bf16 : DType::f16;
        s_g = to_float<H>(uint16_t(sp.x & 0xffff));
        s_g8 = to_float<H>(uint16_t(sp.x >> 16));
        s_hi_g = to_float<H>(uint16_t(sp.y & 0xffff));
        s_hi_g8 = to_float<H>(uint16_t(sp.y >> 16));
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
        if constexpr (kE2m1) {
          dequant_e2m1<A>(words[j], a);
        } else if constexpr (kBits == 4) {
          dequant4<A>(words[j], bias_g, bias_g8, a);
        } else {
          // words[0..3] are mmas 0-1 and words[4..7] mmas 2-3, two words per mma.
          dequant8<A>(words[(j >> 1) * 4 + (j & 1) * 2], words[(j >> 1) * 4 + (j & 1) * 2 + 1], zf_g, zf_g8,
                      bias_g, bias_g8, a);
        }
#pragma unroll
        for (int t = 0; t < kMT; ++t) mma_16816<A>(part[t], a, xb[t][j][0], xb[t][j][1]);
        if (kHalves && j == 1) {  // k16 steps 0 and 1 are the first 32 columns: their own scale
          scale_into(acc[r], part, s_g, s_g8);
          s_g = s_hi_g;
          s_g8 = s_hi_g8;
        }
      }
      scale_into(acc[r], part, s_g, s_g8);
    }
  }

  // acc += part scaled per row (s_g: fragment rows g, s_g8: rows g + 8); part = 0.
  __device__ __forceinline__ static void scale_into(float (&acc)[kMT][4], float (&part)[kMT][4], float s_g,
                                                    float s_g8) {
#pragma unroll
    for (int t = 0; t < kMT; ++t) {
      acc[t][0] += s_g * part[t][0];
      acc[t][1] += s_g * part[t][1];
      acc[t][2] += s_g8 * part[t][2];
      acc[t][3] += s_g8 * part[t][3];
#pragma unroll
      for (int i = 0; i < 4; ++i) part[t][i] = 0.0f;
    }
  }
};

template <int kR, int kMT>
__device__ __forceinline__ void zero(float (&acc)[kR][kMT][4]) {
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int t = 0; t < kMT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][t][i] = 0.0f;
}

// One block's pass over chunks [chunk_begin, chunk_end) of row tiles tile0 .. tile0 + kR - 1 (w_tile0 in the
// layout: tile0, or the expert's first tile plus tile0) for the pipeline's tokens; warp w takes chunks
// chunk_begin + w, + kWarps, ... Then the warps' partial sums are reduced in the pipeline's shared memory
// (idle by then: it holds every warp's kR * kMT * 16 bytes per lane, DecodeTuning.smem_bytes) and the tile
// written (split-K: added to p.sums, the last block of the tile writing the totals, with one token tile; else
// added to the fp32 output): token t goes to out row
// row0 + t. Each value is summed in warp order: without split-K, equal inputs give bit-equal outputs on every
// call. The pipeline's shared memory may be refilled after it.
template <DType A, int kBits, bool kE2m1, int kZero, DType S, DType O, DType B, int kMT, int kR, int kWarps,
          int kStages, bool kSplit, bool kReadBack, bool kGrouped, int kAct>
__device__ __forceinline__ void tile_pass(const Params& p, Pipeline<A, kBits, kE2m1, kZero, S, kMT, kR, kWarps, kStages>& pipe,
                                          uint4* smem, int tile0, int w_tile0, int chunk_begin, int chunk_end,
                                          int row0, int expert) {
  static_assert(!kReadBack || kSplit, "the read-back is split-K's");
  constexpr int kThreads = kWarps * 32;
  const int lane = pipe.lane;
  const int first = chunk_begin + pipe.warp;
  pipe.seek(p, w_tile0, first);
  int next = first;  // the chunk the next issue copies
  auto issue = [&](int stage) {
    if (next < chunk_end) pipe.copy(stage, next >> p.group_shift);
    next += kWarps;
    cp_async_commit();  // empty groups past the end keep the group count uniform
  };

  float acc[kR][kMT][4];
  zero(acc);
  // The first kStages - 1 chunks (pipe.prime): their weights first, then, behind humming's activation pass
  // (programmatic launch), the wait for the activations it writes, then their activations. All the weights are
  // in the first commit group, each chunk's activations in its own.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (first + s * kWarps < chunk_end) pipe.copy_weights(s, (first + s * kWarps) >> p.group_shift);
  }
  grid_dependency_wait();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (next < chunk_end) pipe.copy_x(s);
    next += kWarps;
    cp_async_commit();
  }
  int stage = 0;
  for (int chunk = first; chunk < chunk_end; chunk += kWarps) stage = pipe.step(stage, issue, acc);
  cp_async_wait<0>();

  constexpr int kTileValues = kR * kMT * 32 * 4;
  float4* partial = reinterpret_cast<float4*>(smem);  // [warp][r][t][lane]
  __syncthreads();  // every warp is done with the pipeline's slots
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int t = 0; t < kMT; ++t)
      partial[((pipe.warp * kR + r) * kMT + t) * 32 + lane] =
          make_float4(acc[r][t][0], acc[r][t][1], acc[r][t][2], acc[r][t][3]);
  __syncthreads();
  const float* sums = reinterpret_cast<const float*>(smem);
  auto total = [&](int idx) {
    float sum = sums[idx];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) sum += sums[w * kTileValues + idx];
    return sum;
  };
  if constexpr (kAct != kNoAct) {
    // Values idx = [r][t][lane][i] with i = 0, 1 are gates (fragment row g), i + 2 the ups (row g + 8) of
    // feature f = 8 * (tile0 + r) + g; out is [M, N / 2].
    const int inter = p.N / 2;
    for (int j = threadIdx.x; j < kTileValues / 2; j += kThreads) {
      const int idx = (j >> 1) * 4 + (j & 1);
      const int i = idx & 3, l = (idx >> 2) & 31, t = (idx >> 7) % kMT, r = (idx >> 7) / kMT;
      const int token = acc_token(t, l, i);
      const int f = (tile0 + r) * 8 + (l >> 2);
      float gate = total(idx), up = total(idx + 2);
      if (p.bias != nullptr) {
        const long gate_col = p.gate_up_interleaved ? 2 * f : f, up_col = p.gate_up_interleaved ? 2 * f + 1 : inter + f;
        gate += load_float<B>(p.bias, long(expert) * p.N + gate_col);
        up += load_float<B>(p.bias, long(expert) * p.N + up_col);
      }
      gate = to_float<O>(from_float<O>(gate));
      up = to_float<O>(from_float<O>(up));
      store_float<O>(p.out, long(row0 + token) * p.out_stride + f, gated<kAct>(gate, up, p.act_alpha, p.act_limit));
    }
  } else {
    for (int idx = threadIdx.x; idx < kTileValues; idx += kThreads) {
      const int i = idx & 3, l = (idx >> 2) & 31, t = (idx >> 7) % kMT, r = (idx >> 7) / kMT;
      const int token = acc_token(t, l, i);
      const int n = acc_row(tile0, r, l, i);
      if (!kGrouped && token >= p.M) continue;
      const float v = epilogue<B>(p, token, long(expert) * p.N + n, total(idx), chunk_begin == 0);
      if constexpr (kReadBack) {
        red_add_f32(p.sums + long(token) * p.N + n, v);
      } else if constexpr (kSplit) {
        atomicAdd(static_cast<float*>(p.out) + long(row0 + token) * p.out_stride + n, v);
      } else {
        store_float<O>(p.out, long(row0 + token) * p.out_stride + n, v);
      }
    }
  }
  if constexpr (kReadBack) __threadfence();  // this thread's adds are visible before the block's arrival below
  __syncthreads();  // every thread has read the partial sums
  if constexpr (kReadBack) {
    // The tile's last block to arrive (of gridDim.y) writes the totals: atomicExch reads them at L2, where
    // the adds went, and leaves the zeros the next call needs; then it resets the counter.
    int last = 0;
    if (threadIdx.x == 0) last = atomicAdd(p.arrivals + blockIdx.x, 1) == int(gridDim.y) - 1;
    if (__syncthreads_or(last)) {
      __threadfence();  // every other block's adds happened before its arrival, which this block saw
      for (int idx = threadIdx.x; idx < kTileValues; idx += kThreads) {
        const int i = idx & 3, l = (idx >> 2) & 31, t = (idx >> 7) % kMT, r = (idx >> 7) / kMT;
        const int token = acc_token(t, l, i);
        if (token >= p.M) continue;
        const int n = acc_row(tile0, r, l, i);
        store_float<O>(p.out, long(token) * p.out_stride + n, atomicExch(p.sums + long(token) * p.N + n, 0.0f));
      }
      if (threadIdx.x == 0) p.arrivals[blockIdx.x] = 0;
    }
  }
}

// Schedules tiles and split_k: block (blockIdx.x, blockIdx.y) = row tiles blockIdx.x * kR .. + kR - 1,
// chunks [blockIdx.y * chunks_per_split, +chunks_per_split). Grouped (kGrouped): the block's row tiles for
// every used unit of kMT * 8 grouped rows among units blockIdx.y, blockIdx.y + gridDim.y, ..., all K.
template <DType A, int kBits, bool kE2m1, int kZero, DType S, DType O, DType B, int kMT, int kR, int kWarps,
          int kStages, bool kSplit, bool kReadBack, bool kGrouped, int kAct>
__device__ __forceinline__ void run_tiles(const Params& p) {
  static_assert(!(kGrouped && kSplit), "the grouped variant runs whole K per block");
  static_assert(kAct == kNoAct || (kGrouped && O != DType::f32), "the gated epilogue is grouped, 16-bit O");
  extern __shared__ uint4 smem[];
  Pipeline<A, kBits, kE2m1, kZero, S, kMT, kR, kWarps, kStages> pipe(p, smem, kWarps);
  const int tile0 = blockIdx.x * kR;
  const int n_chunks = p.K / 64;
  if constexpr (!kGrouped) {
    const int chunk_begin = blockIdx.y * p.chunks_per_split;
    const int chunk_end = min(n_chunks, chunk_begin + p.chunks_per_split);
    tile_pass<A, kBits, kE2m1, kZero, S, O, B, kMT, kR, kWarps, kStages, kSplit, kReadBack, false, kAct>(
        p, pipe, smem, tile0, tile0, chunk_begin, chunk_end, 0, 0);
  } else {
    grid_dependency_wait();  // launched programmatically: expert ids, rows and x may be the previous kernel's
    constexpr int kRows = kMT * 8;
    const int units = p.M / kRows, stride = gridDim.y;
    for (int base = blockIdx.y; base < units; base += 32 * stride) {
      // 32 candidate units, one per lane; every warp finds the same used ones.
      const int unit = base + pipe.lane * stride;
      const int lane_expert = unit < units ? __ldg(p.expert_ids + unit * kRows / p.block_m) : -1;
      const bool lane_used = lane_expert >= 0 && lane_expert < p.num_experts;
      for (unsigned used = __ballot_sync(0xffffffffu, lane_used); used != 0; used &= used - 1) {
        const int l = __ffs(used) - 1;
        const int expert = __shfl_sync(0xffffffffu, lane_expert, l);
        const int row0 = (base + l * stride) * kRows;
        pipe.set_rows(p, row0);
        tile_pass<A, kBits, kE2m1, kZero, S, O, B, kMT, kR, kWarps, kStages, false, false, true, kAct>(
            p, pipe, smem, tile0, expert * (p.N / 16) + tile0, 0, n_chunks, row0, expert);
      }
    }
  }
}

// This warp's sums over `units` of the `n_chunks` chunks of row tiles tile * kR .. + kR - 1 are
// complete: write them when it covered the whole tile; else add them to p.sums and the unit count to the
// tile's counter. Every unit is covered by exactly one warp, so the warp whose count brings the counter
// to n_chunks arrives last (no division needed to count contributors): it writes the tile's totals and
// leaves its sums and counter at zero.
template <DType O, DType B, int kMT, int kR>
__device__ __forceinline__ void finish_tile(const Params& p, int tile, int units, int n_chunks, int lane,
                                            const float (&acc)[kR][kMT][4]) {
  lane = opaque(lane);
  const int tile0 = tile * kR;
  const bool alone = units == n_chunks;
  if (!alone) {
#pragma unroll
    for (int r = 0; r < kR; ++r)
#pragma unroll
      for (int t = 0; t < kMT; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int token = acc_token(t, lane, i);
          if (token < p.M) red_add_f32(p.sums + long(token) * p.N + acc_row(tile0, r, lane, i), acc[r][t][i]);
        }
    __threadfence();  // this lane's adds are visible before the arrival below
    __syncwarp();
    int arrived = 0;
    if (lane == 0) arrived = atomicAdd(p.arrivals + tile, units) + units;
    arrived = __shfl_sync(0xffffffffu, arrived, 0);
    if (arrived != n_chunks) return;
    __threadfence();  // every contributor's adds happened before its arrival, which this warp saw
  }
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int t = 0; t < kMT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int token = acc_token(t, lane, i);
        const int n = acc_row(tile0, r, lane, i);
        if (token >= p.M) continue;
        // atomicExch reads the total at L2, where the adds went, and restores the zero.
        const float sum = alone ? acc[r][t][i] : atomicExch(p.sums + long(token) * p.N + n, 0.0f);
        store_float<O>(p.out, long(token) * p.out_stride + n, epilogue<B>(p, token, n, sum, true));
      }
  if (!alone && lane == 0) p.arrivals[tile] = 0;
}

// Schedule stream_k: global warp gw of W = p.total_warps takes units [gw * U / W, (gw + 1) * U / W) of
// the U = tiles x chunks units, unit = tile * chunks + chunk (tile = kR row tiles).
template <DType A, int kBits, bool kE2m1, int kZero, DType S, DType O, DType B, int kMT, int kR, int kWarps,
          int kStages>
__device__ __forceinline__ void run_stream_k(const Params& p) {
  static_assert(8 % kR == 0, "next_tile needs kR to divide the tile group (1 or 8) or the group to be 1");
  extern __shared__ uint4 smem[];
  Pipeline<A, kBits, kE2m1, kZero, S, kMT, kR, kWarps, kStages> pipe(p, smem, 1);
  const int n_chunks = p.K / 64;
  const long units = long(p.N / (16 * kR)) * n_chunks;  // U
  const long warps = p.total_warps;  // W
  const long gw = long(blockIdx.x) * kWarps + pipe.warp;
  const long u_begin = gw * units / warps;
  const int count = int((gw + 1) * units / warps - u_begin);
  if (count == 0) return;  // more warps than units; nothing here touches another warp's state
  int tile = int(u_begin / n_chunks);
  int chunk = int(u_begin - long(tile) * n_chunks);

  // Copy side: the cursors walk the same units, kStages - 1 ahead, wrapping to the next tile.
  int copy_tile = tile, copy_chunk = chunk, copy_left = count;
  pipe.seek(p, copy_tile * kR, copy_chunk);
  auto issue = [&](int stage) {
    if (copy_left > 0) {
      pipe.copy(stage, copy_chunk >> p.group_shift);
      if (--copy_left > 0 && ++copy_chunk == n_chunks) {
        copy_chunk = 0;
        pipe.next_tile(p, ++copy_tile * kR);
      }
    }
    cp_async_commit();  // empty groups past the end keep the group count uniform
  };

  float acc[kR][kMT][4];
  zero(acc);
  grid_dependency_wait();  // behind humming's activation pass: its output is visible from here
  int stage = pipe.prime(issue);
  int share_begin = chunk;  // the first chunk of this warp's share of `tile`
  for (int left = count; left > 0; --left) {
    stage = pipe.step(stage, issue, acc);
    if (++chunk == n_chunks || left == 1) {  // this warp's share of the tile is done
      finish_tile<O, B, kMT, kR>(p, tile, chunk - share_begin, n_chunks, pipe.lane, acc);
      zero(acc);
      chunk = share_begin = 0;
      ++tile;
    }
  }
  cp_async_wait<0>();
}

// kZero >= 0: every zero point is kZero; kZero < 0: zero points come from p.zeros.
// kMT token tiles of 8 (M <= 8 * kMT; grouped: units of 8 * kMT grouped rows); kR 16-row tiles per warp;
// kStages chunks in flight per thread; kGrouped: the grouped variant (tiles schedule), kAct its gated epilogue.
template <DType A, int kBits, bool kE2m1, int kZero, DType S, DType O, DType B, int kMT, int kR, int kWarps,
          int kStages, Schedule kSchedule, bool kGrouped = false, int kAct = kNoAct>
__device__ __forceinline__ void run(const Params& p) {
  launch_dependents();  // a kernel launched programmatically behind this one starts (and waits) now
  if constexpr (kSchedule == Schedule::stream_k) {
    static_assert(!kGrouped, "the grouped variant runs the tiles schedule");
    run_stream_k<A, kBits, kE2m1, kZero, S, O, B, kMT, kR, kWarps, kStages>(p);
  } else {
    constexpr bool kReadBack = kSchedule == Schedule::split_k_read_back;
    run_tiles<A, kBits, kE2m1, kZero, S, O, B, kMT, kR, kWarps, kStages, kSchedule == Schedule::split_k || kReadBack,
              kReadBack, kGrouped, kAct>(p);
  }
}

}  // namespace decode
}  // namespace humming
