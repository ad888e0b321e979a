// FP8 GEMM for Hopper (sm_90a): out[M, N] = (x[M, K] @ W[N, K]^T) * scales + bias, with e4m3 activations,
// e4m3 weights (W8A8) or int4 weights turned into e4m3 in registers (W4A8, exact: -8..7 are e4m3 values),
// fp32 accumulation on wgmma and bf16 / fp16 (TMA-store epilogue) or fp32 (plain-store epilogue) output.
//
// Shape of the kernel:
// - weights are the wgmma A operand and tokens the B operand (the kernel computes out^T tile by tile):
//   A must have 64 rows per warpgroup, while B may have as few as 8, so decode-sized M wastes no tensor
//   core work and one kernel covers M = 1 .. any;
// - one block computes kBlockN = 64 * kWgs channels x kBlockM tokens; K runs in blocks of 128 (one
//   128-byte row of e4m3 = one 128-byte TMA swizzle row);
// - warp specialisation: warpgroup kWgs (the last) is the producer, one thread of it issues TMA loads of
//   the weight and activation tiles into a kStages-deep ring of shared-memory stages, each completing on
//   its `full` mbarrier; warpgroups 0 .. kWgs-1 are consumers, each runs four m64nKBlockMk32 wgmmas per
//   stage on its 64 weight rows and releases the stage through its `empty` mbarrier (one arrive per warp
//   when wgmma reads the stage itself; one per thread when the threads read it with ld.shared, so that
//   each thread's own loads are ordered before the refill by its own arrive).
//   setmaxnreg moves registers from the producer to the consumers;
// - promotion: each 128-wide K block is accumulated by wgmma in its own registers and then added, in
//   plain fp32, into the running total (tensor-core fp8 accumulation keeps fewer mantissa bits than fp32;
//   promoting once per 128 keeps the sum at fp32 accuracy). With kBlockScale the K block's partial sum is
//   multiplied by its scales there: weight block (128 x 128) times activation group (1 x 128) — the
//   DeepSeek-V3 recipe. Where the scales wait for the epilogue, 128-token tiles may sum two or four K blocks
//   in the tensor core before each promotion (kPromoteBlocks, a tuning: 8 or 16 fp8 accumulation steps of 32
//   instead of 4), which halves or quarters the promotions' adds and waits;
// - epilogue: total * w_scale[n] * x_scale[m] + bias[n] (per-channel or per-tensor weights, per-token or
//   per-tensor activations), rounded to bf16 / fp16, written transposed into shared memory with
//   stmatrix.trans (128-byte swizzled, conflict-free) and stored by TMA, which clips rows and columns
//   outside [M, N]. Loads past the edges of W and x are zero-filled by TMA, so any M, N and K work
//   (the host pads K to a multiple of 16 for the TMA stride rule).
// - W4A8 (kWFormat == 1): the host pre-tiles int4 weights so that each 64-row x 128-K tile is one contiguous
//   4 KiB block in wgmma A-fragment order (fp8_gemm.py, `_pack_nibbles`), each value as a code of
//   `int4x8_to_e4m3`; the producer fetches it with one bulk copy, each consumer thread reads its 32 bytes
//   with two 16-byte shared loads and turns every 4 codes into 4 e4m3 bytes with two prmt and one lop3;
//   wgmma takes A from registers, and the next K block is converted into a second set of them while the
//   wgmmas run. Group scales (groups of 128 multiples along K) are applied per row at each promotion.
// - W4A8 MXFP4 (kWFormat == 2): e2m1 codes (sign and magnitude) in the same tiles, each tile followed by 256
//   bytes of table offsets (one byte per row and 32-K group = one wgmma k-step); one bulk copy fetches both.
//   The e8m0 scales are folded on the host: 2^(max group exponent - 6) of each row goes into a per-row scale
//   applied in the epilogue (scale mode 0, as per-channel weights; where every row's groups span at most 12
//   binades), else that of each row and 128-K block into the per-row scale of the block's promotion (scale
//   mode 2), and each group's remaining 2^d (d in [-5, 6]) into the consumer's magnitude -> e4m3 table (two
//   integer multiply-adds: e2m1 * 2^d stays an e4m3 normal; `mx_table`). Exact: the products are those of
//   dequantize.
// - Grouped (MoE) variant, kGrouped: the weights are E experts stacked along N, each N rounded up to Np, a
//   multiple of 128, with zero rows (e4m3: one [E * Np, Kp] map; 4-bit: expert e's tiles after those of
//   experts 0 .. e-1), scales likewise ([E * Np] per-channel, [E * Np / 128, num_kb] blocks, [num_kb, E * Np]
//   per-row groups), bias [E, N]: no weight tile straddles two experts, and the columns past N are not
//   stored. x rows come grouped by expert in segments of block_m rows
//   (kBlockM divides block_m) and expert_ids[i] is the expert of rows [i * block_m, (i + 1) * block_m),
//   -1 for unused segments, whose blocks return before any barrier (their output rows are not written).
// - Tiles: block b computes tiles b, b + gridDim.x, ... in a grouped raster. A grid of one block per tile runs
//   one each; a persistent grid (one block per block slot, the host's choice) walks several, with its stage
//   ring, barrier phases and pipeline step count running on across them, so that the producer loads a tile's
//   first stages while the consumers run the epilogue of the tile before, and each warpgroup's TMA store is
//   waited on only before its output slab is written again (or before the block exits).
// - Programmatic launch: the block lets the kernel launched behind it start at once. Launched behind humming's
//   activation pass, a dense block's producer loads the weights of its first kStages steps before
//   grid_dependency_wait and their activations after it, and the consumers wait before reading the
//   activations' scales; a grouped block (launched so behind any kernel) waits before reading anything.
// - Split-K (kSplitK): blockIdx.z of gridDim.z takes the K blocks [z * num_kb / Z, (z + 1) * num_kb / Z)
//   (possibly none), so that small-M calls whose tile grid leaves block slots empty still stream the
//   weights from every slot. Its partial sum is already in fp32 and already scaled (per-channel x per-token
//   scales are linear; block and group scales are applied at each promotion); it is added with
//   red.global.add.f32 into `out`, an fp32 [M, N] workspace the host zero-fills, and split 0 adds the bias.
//   The host rounds the workspace to the output dtype. Results differ from one split only by fp32
//   summation order. Not with kGrouped. With kReadBack the splits add into `sums` instead, a workspace that
//   is zero between calls, and count themselves in at the tile's arrival counter; the split that arrives last
//   reads the tile's totals back (atomicExch, which leaves the zeros) and writes them to `out` in O, then
//   resets the counter: no memset and no rounding pass on the host.
#include "humming/common.cuh"
#include "humming/sm90_ptx.cuh"

namespace humming {
namespace fp8_sm90 {
using namespace sm90;

struct alignas(64) Params {
  TensorMap w_map;             // e4m3 weights [N, Kp], box {128, kBlockN}, 128-byte swizzle
  TensorMap x_map;             // e4m3 activations [M, Kp], box {128, kBlockM}, 128-byte swizzle
  TensorMap out_map;           // 16-bit output [M, N], box {64, kBlockM}, 128-byte swizzle
  const float* w_scale;        // [tiles_n * kBlockN] per-channel scales (per-tensor: expanded), epilogue mode
  const float* x_scale;        // per-token [M] (x_scale_stride 1) or per-tensor [1] (x_scale_stride 0)
  const float* w_block_scale;  // [ceil(N / 128), num_kb] scales of 128 x 128 weight blocks, block mode
  const float* x_block_scale;  // [num_kb, x_block_stride] scales of 1 x 128 activation groups, block mode
  const void* bias;            // [N] of dtype B, or null
  int M, N, num_kb;
  int x_scale_stride, x_block_stride;
  int tiles_m, tiles_n, group_m;
  void* out;                   // [M, N] of dtype O, row stride out_stride elements (direct-store epilogue;
                               // kSplitK: the zero-filled fp32 workspace the splits add into)
  int out_stride;
  const uint8_t* w_packed;     // 4-bit weights, [N / 64][num_kb][tile bytes] in fragment order (kWFormat 1, 2)
  const float* w_group_scale;  // [num_kb, w_group_stride] per-row scales of each K block (kScaleMode == 2)
  int w_group_stride;
  const int* expert_ids;       // grouped: [M / block_m] expert of each segment, -1 = skip; else null
  int block_m;                 // grouped: rows per expert_ids entry
  float* sums;                 // kReadBack: [M, N] fp32, zero between calls
  int* arrivals;               // kReadBack: [tiles_m * tiles_n] counters, zero between calls
};
static_assert(sizeof(Params) == 576, "the host mirrors this layout (_fp8_launch.py, _Params)");

constexpr int kBK = 128;  // K per pipeline stage (bytes of e4m3 per tile row)

// Weight formats (kWFormat): e4m3 bytes through TMA, or 4-bit codes pre-tiled in fragment order: int4, or
// MXFP4 e2m1 with a 256-byte block of per-(row, k-step) table offsets after each 4 KiB tile.
enum WFormat : int { kE4m3 = 0, kInt4 = 1, kMxfp4 = 2 };
constexpr int kCodeBytes = 4096;  // one 64-row x 128-K tile of 4-bit codes
constexpr int kOffsetBytes = 256;  // MXFP4: table offsets of 64 rows x 4 k-steps, after the codes

// Dynamic shared memory: [stages x (W tiles, x tile)] [kWgs output slabs] [full, empty barriers], from a
// 1024-byte aligned base (the swizzle atom); the W tiles are padded to whole atoms so that x tiles stay aligned.
template <int kWgs, int kBlockM, int kStages, int kWFormat>
struct SmemLayout {
  static constexpr int kBlockN = 64 * kWgs;
  static constexpr int kTile = kCodeBytes + (kWFormat == kMxfp4 ? kOffsetBytes : 0);  // 4-bit: bytes per tile
  static constexpr int kWBytes = kWFormat == kE4m3 ? kBlockN * kBK : kWgs * kTile;
  static constexpr int kWRegion = (kWBytes + 1023) / 1024 * 1024;
  static constexpr int kXBytes = kBlockM * kBK;
  static constexpr int kStageBytes = kWRegion + kXBytes;
  static constexpr int kStageTx = kWBytes + kXBytes;  // bytes the copies of one stage bring
  static constexpr int kOutSlab = kBlockM * 128;  // one warpgroup's [kBlockM tokens][64 channels] 16-bit
  static constexpr int kOut = kStages * kStageBytes;
  static constexpr int kBars = kOut + kWgs * kOutSlab;
  static constexpr int kTable = kBars + 16 * kStages;  // int4: two words of the code table (int4x8_to_e4m3)
  static constexpr int kBytes = 1024 + kTable + (kWFormat == kInt4 ? 16 : 0);  // + worst-case base alignment
};

// int4 weights as 4-bit codes that two prmt and one xor turn into e4m3. prmt picks byte (sel & 7) of {b, a},
// or, where selector bit 3 is set, that byte's sign bit replicated (0x00 / 0xFF). With P = prmt(kPos, c)
// and N = prmt(kNeg, c ^ 8), byte = P ^ N gives, for code c < 8, kPos[c] (N is 0x00: kNeg's bytes are
// below 0x80), and for c = 8 + j, kNeg[j] ^ (0x00 or 0xFF as kPos[j] is positive or negative). So codes
// j and 8 + j have values of one sign: codes 0-3 -> 0, 1, 2, 3 and 8-11 -> 4, 5, 6, 7 (kPos[0..3],
// kNeg[0..3]); codes 4-7 -> -1 .. -4 (kPos[4..7]) and 12-15 -> -5 .. -8 (kNeg[4..7], stored inverted).
// The host writes these codes (_fp8_layout.py, `_INT4_CODES`); code 0 is 0, so zero padding stays zero.
constexpr uint32_t kPos0 = 0x44403800u, kPos1 = 0xC8C4C0B8u;  // e4m3 of 0, 1, 2, 3 | -1, -2, -3, -4
constexpr uint32_t kNeg0 = 0x4E4C4A48u, kNeg1 = 0x2F313335u;  // e4m3 of 4, 5, 6, 7 | ~(e4m3 of -5 .. -8)

// Eight codes of `w` (code i in bits 4i .. 4i + 3) -> e4m3 bytes of codes 0-3 in `lo`, 4-7 in `hi`.
// `pos0` / `neg0` are kPos0 / kNeg0 read from shared memory: prmt takes one table word from a register,
// and ptxas would otherwise copy a constant into a register before every prmt.
__device__ __forceinline__ void int4x8_to_e4m3(uint32_t w, uint32_t pos0, uint32_t neg0, uint32_t& lo, uint32_t& hi) {
  const uint32_t flipped = w ^ 0x88888888u;
  lo = prmt(pos0, kPos1, w) ^ prmt(neg0, kNeg1, flipped);
  hi = prmt(pos0, kPos1, w >> 16) ^ prmt(neg0, kNeg1, flipped >> 16);
}

// MXFP4: the e4m3 byte of e2m1 magnitude code m (0, .5, 1, 1.5, 2, 3, 4, 6) times 2^d, from the table offset
// o = d + 6 (1 .. 12; _fp8_layout.py, `_compute_mx_fold`): 0 for m = 0, 8 o for .5 (exponent field o), and
// 8 o + {8, 12, 16, 20, 24, 28} for 1 .. 6 (exponent and mantissa fields of 2^(m / 2 - 1) (1 + m % 2 / 2) 2^d);
// every byte stays below 0x80. `mx_table` builds the eight bytes as two words, one multiply-add each.
struct MxTable {
  uint32_t lo, hi;  // e4m3 bytes of magnitude codes 0-3 and 4-7
};

__device__ __forceinline__ MxTable mx_table(uint32_t offset) {
  return {offset * 0x08080800u + 0x0C080000u, offset * 0x08080808u + 0x1C181410u};
}

// Eight codes of `w` -> e4m3 bytes of row r (table `lo_t`) in `lo`, row r + 8 (`hi_t`) in `hi`. The host packs
// each word as nibbles whose bits 0-2 are magnitude codes (nibbles 0-3: lo's bytes 0-3, 4-7: hi's) and whose
// bit 3 is a sign: nibble 2j that of lo's byte j, nibble 2j + 1 that of hi's byte j (`_pack_mx_signs`), so
// that prmt looks up four magnitudes from the low half of the masked word (its selectors' bit 3, the sign
// replication, clear) and one and-or moves four signs into place.
__device__ __forceinline__ void e2m1x8_to_e4m3(uint32_t w, const MxTable& lo_t, const MxTable& hi_t, uint32_t& lo,
                                               uint32_t& hi) {
  const uint32_t magnitudes = w & 0x77777777u;
  lo = ((w << 4) & 0x80808080u) | prmt(lo_t.lo, lo_t.hi, magnitudes);
  hi = (w & 0x80808080u) | prmt(hi_t.lo, hi_t.hi, magnitudes >> 16);
}

// The consumers' helpers that take arrays of several sizes or callables are function templates: NVRTC 13.0
// refuses lambdas with auto parameters in device code (tests/test_cuda_compile.py checks none is left).

// Adds partial sums d of the kGroups token groups (8 tokens each, the tile's groups kFirst ...) times their scales
// (Scales: the consumer's BlockScales) into total, after the caller's fence_registers(d).
template <int kGroups, bool kBlockScale, int kScaleMode, int kFirst = 0, class Scales>
__device__ __forceinline__ void accumulate_groups(float (&total)[4 * kGroups], const float (&d)[4 * kGroups],
                                                  const Scales& b) {
#pragma unroll
  for (int j = 0; j < kGroups; ++j) {
    if constexpr (kBlockScale) {
      const float s0 = b.w_block * b.x_block[kFirst + j].x;
      const float s1 = b.w_block * b.x_block[kFirst + j].y;
      total[4 * j + 0] = fmaf(d[4 * j + 0], s0, total[4 * j + 0]);
      total[4 * j + 1] = fmaf(d[4 * j + 1], s1, total[4 * j + 1]);
      total[4 * j + 2] = fmaf(d[4 * j + 2], s0, total[4 * j + 2]);
      total[4 * j + 3] = fmaf(d[4 * j + 3], s1, total[4 * j + 3]);
    } else if constexpr (kScaleMode == 2) {
      total[4 * j + 0] = fmaf(d[4 * j + 0], b.w_row0, total[4 * j + 0]);
      total[4 * j + 1] = fmaf(d[4 * j + 1], b.w_row0, total[4 * j + 1]);
      total[4 * j + 2] = fmaf(d[4 * j + 2], b.w_row1, total[4 * j + 2]);
      total[4 * j + 3] = fmaf(d[4 * j + 3], b.w_row1, total[4 * j + 3]);
    } else {
#pragma unroll
      for (int c = 0; c < 4; ++c) total[4 * j + c] += d[4 * j + c];
    }
  }
}

// kTwoAccumulators (token tiles of at most 64): the steps in groups of kGroupSteps. Within a group each step's
// wgmmas go into the accumulator set of its parity, issued before the previous step is waited on
// (wgmma_wait<1>), so that the previous step's promotion runs while they do; a group ends with no wgmma in
// flight (a loop that carried the accumulators of wgmmas in flight would have them copied, and ptxas
// serialise every wgmma). The steps past the last whole group run one at a time. step(i, parity): wait for
// pipeline step i and issue its wgmmas into set `parity` (acc, acc1); promote(set, scales): release the oldest
// unreleased step's stage and add the set into the total.
template <int kAcc, class LoadScales, class Step, class Promote>
__device__ __forceinline__ void two_sets(int kb_begin, int kb_count, const LoadScales& load_scales, const Step& step,
                                         const Promote& promote, float (&acc)[kAcc], float (&acc1)[kAcc]) {
  constexpr int kGroupSteps = 4;
  int i = 0;
  for (; i + kGroupSteps <= kb_count; i += kGroupSteps) {
    auto b0 = load_scales(kb_begin + i);
    decltype(b0) b1;
    step(i, 0);
#pragma unroll
    for (int j = 0; j < kGroupSteps; j += 2) {
      b1 = load_scales(kb_begin + i + j + 1);
      step(i + j + 1, 1);
      wgmma_wait<1>();
      promote(acc, b0);
      if (j + 2 < kGroupSteps) {
        b0 = load_scales(kb_begin + i + j + 2);
        step(i + j + 2, 0);
        wgmma_wait<1>();
      } else {
        wgmma_wait<0>();
      }
      promote(acc1, b1);
    }
  }
  for (; i < kb_count; ++i) {
    const auto b = load_scales(kb_begin + i);
    step(i, 0);
    wgmma_wait<0>();
    promote(acc, b);
  }
}

// Token halves (128-token tiles promoted at every K block): each K block's wgmmas as two groups, tokens 0-63 into
// h0 and 64-127 into h1. Once a block's h0 group is done its promotion runs behind the h1 group, and the block's h1
// promotion behind the next block's h0 group, so that the tensor core keeps working through promotions (128 tokens
// leave no registers for a second whole accumulator set). Groups of kGroupBlocks K blocks end with no wgmma in
// flight (ptxas serialises the wgmmas of a chain left in flight across a loop's iterations); the blocks past the
// last whole group run one at a time. begin(parity): waits for the next pipeline step and returns its operands
// (4-bit weights: A fragment set `parity`, ready); issue(operands, parity, half, d): one half's group into d;
// ready(i, parity): makes step i's A operand ready in set `parity` (4-bit weights convert its codes), while both
// groups of the step before run: in a branch of its own, which keeps ptxas from moving it after their wait;
// release(): the oldest unreleased step's stage; promote(d, half, scales).
template <int kHalf, class LoadScales, class Begin, class Issue, class Ready, class Release, class Promote>
__device__ __forceinline__ void token_halves(int kb_begin, int kb_count, const LoadScales& load_scales,
                                             const Begin& begin, const Issue& issue, const Ready& ready,
                                             const Release& release, const Promote& promote, float (&h0)[kHalf],
                                             float (&h1)[kHalf]) {
  constexpr int kGroupBlocks = 4;
  if (kb_count > 0) ready(0, 0);
  int i = 0;
  for (; i + kGroupBlocks <= kb_count; i += kGroupBlocks) {
    decltype(load_scales(0)) b[2];
#pragma unroll
    for (int j = 0; j < kGroupBlocks; ++j) {
      b[j % 2] = load_scales(kb_begin + i + j);
      const auto operands = begin(j % 2);
      issue(operands, j % 2, 0, h0);
      if (j > 0) {
        wgmma_wait<1>();  // block j - 1's h1 group
        release();
        promote(h1, 1, b[(j - 1) % 2]);
      }
      issue(operands, j % 2, 1, h1);
      if (i + j + 1 < kb_count) ready(i + j + 1, (j + 1) % 2);  // true inside the group
      wgmma_wait<1>();  // block j's h0 group
      promote(h0, 0, b[j % 2]);
    }
    wgmma_wait<0>();
    release();
    promote(h1, 1, b[(kGroupBlocks - 1) % 2]);
  }
  for (; i < kb_count; ++i) {  // set 0 holds block i's A operand
    const auto b = load_scales(kb_begin + i);
    const auto operands = begin(0);
    issue(operands, 0, 0, h0);
    issue(operands, 0, 1, h1);
    wgmma_wait<0>();
    release();
    promote(h0, 0, b);
    promote(h1, 1, b);
    if (i + 1 < kb_count) ready(i + 1, 0);
  }
}

// kWFormat: a WFormat (e4m3 weights through TMA, or pre-tiled 4-bit codes through bulk copies).
// kScaleMode: 0 = scales in the epilogue (per-tensor / per-channel weights, per-token / per-tensor
// activations); 1 = 128 x 128 weight blocks x 1 x 128 activation groups at each promotion; 2 = per-row
// weight scales of each K block at each promotion, activation scales in the epilogue.
// kTmaStore: epilogue through shared memory (stmatrix) and a TMA store; else plain global stores.
// kGrouped: the MoE variant; kSplitK: blockIdx.z adds its K range's partial sums into p.out (header comment).
// kPromoteBlocks: K blocks whose wgmmas add into the same accumulators before each promotion, 1, 2 or 4 (above 1:
// scale mode 0 with 128-token tiles; the header comment's "promotion").
// kPrefetchCodes: 4-bit weights, tiles of more than 64 tokens: each conversion reads the next K block's codes from
// shared memory ("convert").
// kTokenHalves: 128-token tiles promoted at every K block: each block's wgmmas as two groups of 64 tokens, each
// half promoted while the other's group runs (token_halves).
// kReadBack: split-K's last split writes the tile in O (header comment).
template <int kWgs, int kBlockM, int kStages, int kWFormat, int kScaleMode, bool kTmaStore, bool kGrouped,
          bool kSplitK, DType O, DType B, int kProducerRegs, int kConsumerRegs, int kPromoteBlocks,
          bool kPrefetchCodes, bool kTokenHalves, bool kReadBack>
__device__ __forceinline__ void run(const Params& p) {
  using L = SmemLayout<kWgs, kBlockM, kStages, kWFormat>;
  constexpr bool kBlockScale = kScaleMode == 1;
  constexpr bool kMx = kWFormat == kMxfp4;
  static_assert(kWFormat == kE4m3 || kWFormat == kInt4 || kMx, "e4m3, int4 or MXFP4 weights");
  static_assert(!kMx || kScaleMode == 0 || kScaleMode == 2, "MXFP4 folds its scales per row, or per row and K block");
  static_assert(kScaleMode >= 0 && kScaleMode <= 2, "scale mode 0, 1 or 2");
  constexpr int kBlockN = L::kBlockN;
  constexpr int kAcc = kBlockM / 2;
  // Token tiles of at most 64: two sets of wgmma accumulators, so that a K block's promotion overlaps the next
  // block's wgmmas (with 128 tokens, three sets of 64 accumulators and the A fragments exceed the registers).
  constexpr bool kTwoAccumulators = kBlockM <= 64;
  constexpr int kReleasesPerWg = kWFormat == kE4m3 ? 4 : 128;  // see "warp specialisation" above
  static_assert(kBlockM % 8 == 0 && kBlockM <= 128, "tokens per block: a multiple of 8, at most 128");
  static_assert(!kTmaStore || O == DType::bf16 || O == DType::f16, "the TMA-store epilogue writes 16-bit floats");
  static_assert(!kSplitK || (!kTmaStore && !kGrouped && (O == DType::f32 || kReadBack)),
                "split-K adds fp32 with plain stores (into out, or read back into it)");
  static_assert(!kReadBack || kSplitK, "the read-back is split-K's");
  static_assert(kPromoteBlocks == 1 || ((kPromoteBlocks == 2 || kPromoteBlocks == 4) && kScaleMode == 0 &&
                                        !kTwoAccumulators),
                "two or four K blocks per promotion: scales in the epilogue, one accumulator set");
  static_assert(!kPrefetchCodes || (kWFormat != kE4m3 && !kTwoAccumulators), "codes read ahead: 4-bit, one set");
  static_assert(!kTokenHalves || (kBlockM == 128 && kPromoteBlocks == 1),
                "token halves: 128-token tiles, a promotion at every K block");

  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t out_base = base + L::kOut;
  const uint32_t bar_base = base + L::kBars;
  auto w_tile = [&](int s) { return base + s * L::kStageBytes; };
  auto x_tile = [&](int s) { return base + s * L::kStageBytes + L::kWRegion; };
  auto full = [&](int s) { return bar_base + 8 * s; };
  auto empty = [&](int s) { return bar_base + 8 * (kStages + s); };

  // Tiles: block b takes tiles b, b + gridDim.x, ... (a persistent grid of fewer blocks than tiles walks several;
  // the stage ring runs on across them, so the producer loads a tile's first stages during the epilogue of the
  // one before). locate(t) sets tile t's coordinates in a grouped raster (group_m token tiles share each weight
  // tile while it is in L2); false for a grouped tile of no expert.
  const int num_tiles = p.tiles_m * p.tiles_n;
  int m_tile = 0, n_tile = 0, expert = 0, w_base = 0;
  auto locate = [&](int t) {
    const int per_group = p.group_m * p.tiles_n;
    const int first_m = t / per_group * p.group_m;
    const int group_rows = min(p.tiles_m - first_m, p.group_m);
    const int in_group = t % per_group;
    m_tile = first_m + in_group % group_rows;
    n_tile = in_group / group_rows;
    if constexpr (kGrouped) {
      expert = __ldg(p.expert_ids + m_tile * kBlockM / p.block_m);
      if (expert < 0) return false;
    }
    // first weight row of the tile: experts are stacked N rounded up to 128 rows apart (zero padding rows)
    w_base = expert * ((p.N + 127) / 128 * 128) + n_tile * kBlockN;
    return true;
  };
  launch_dependents();  // a kernel launched programmatically behind this one starts (and waits) now
  // Grouped: launched programmatically behind any kernel, so wait before reading anything (expert ids first)
  if constexpr (kGrouped) grid_dependency_wait();
  if (gridDim.x == num_tiles && !locate(blockIdx.x)) return;  // a block's only tile is skipped: before any barrier
  // Each tile's K blocks (all of them unless split-K): its K block kb_begin + i is the tile's pipeline step i. The
  // block's steps run through the stage ring in order across its tiles (RingPos).
  const int kb_begin = kSplitK ? int(blockIdx.z) * p.num_kb / int(gridDim.z) : 0;
  const int kb_count = kSplitK ? (int(blockIdx.z) + 1) * p.num_kb / int(gridDim.z) - kb_begin : p.num_kb;

  // The warpgroup, read from lane 0: provably warp-uniform, so the wgmma descriptors derived from it are built in
  // uniform registers (threadIdx.x / 128 alone: rebuilt in vector registers and moved over every K block).
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0);
  const int tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full(s), 1);
      mbar_init(empty(s), kReleasesPerWg * kWgs);
    }
    if constexpr (kWFormat == kInt4) {
      sts_u32(base + L::kTable, kPos0);
      sts_u32(base + L::kTable + 4, kNeg0);
    }
    fence_mbar_init();
  }
  __syncthreads();

  if (wg == kWgs) {
    setmaxnreg_dec<kProducerRegs>();
    if (tid == 0) {
      prefetch_tensor_map(&p.w_map);
      prefetch_tensor_map(&p.x_map);
      // Stage s's full barrier expects the whole stage, and gets K block kb of the located tile's weights.
      auto load_weights = [&](int s, int kb) {
        mbar_expect_tx(full(s), L::kStageTx);
        if constexpr (kWFormat == kE4m3) {
          tma_load_2d(w_tile(s), &p.w_map, full(s), kb * kBK, w_base);
        } else {
#pragma unroll
          for (int w = 0; w < kWgs; ++w) {
            const long tile_index = long(w_base / 64 + w) * p.num_kb + kb;
            bulk_load(w_tile(s) + w * L::kTile, p.w_packed + tile_index * L::kTile, L::kTile, full(s));
          }
        }
      };
      // Behind humming's activation pass (programmatic launch) the weights of a dense block's first kStages steps
      // are loaded before the wait for the pass's output; the loop then loads only their activations. (Grouped
      // blocks locate their tiles through expert_ids, which are read after the wait.)
      int weights_ahead = 0;
      if (!kGrouped && int(blockIdx.x) < num_tiles) {
        locate(blockIdx.x);
        weights_ahead = min(kStages, kb_count);
        for (int i = 0; i < weights_ahead; ++i) load_weights(i, kb_begin + i);  // steps 0 .. : stages 0 ..
      }
      grid_dependency_wait();
      int it = 0;           // pipeline step
      RingPos<kStages> at;  // its place in the ring
      for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
        if (!locate(tile)) continue;
        for (int i = 0; i < kb_count; ++i, ++it, at.advance()) {
          const int kb = kb_begin + i;
          const int s = at.stage;
          if (it >= kStages) mbar_wait(empty(s), at.phase ^ 1);  // the stage's previous turn is released
          if (it >= weights_ahead) load_weights(s, kb);
          tma_load_2d(x_tile(s), &p.x_map, full(s), kb * kBK, m_tile * kBlockM);
        }
      }
    }
  } else {
    setmaxnreg_inc<kConsumerRegs>();
    grid_dependency_wait();  // the activations' scales, read from global memory, are the pass's output
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int col = 2 * (lane % 4);  // this thread's first token column in each group of 8
    const int row = 16 * warp + lane / 4;  // this thread's channels: row and row + 8 of the warpgroup's 64
    int wn = 0;   // the tile's weight row of this thread (of expert `expert`)
    // Every pipeline step is waited for, issued and released once, each in step order: a ring position for each.
    RingPos<kStages> acquired, issued, released;
    // wgmma descriptors of stage 0's tiles; stage s's are kStageBytes * s bytes on (the start address field, in
    // 16-byte units, stays below 2^14: shared memory addresses are below 256 KiB)
    constexpr uint32_t kStageDesc = L::kStageBytes >> 4;
    const uint64_t w_desc0 = sw128_desc(w_tile(0) + wg * 64 * kBK), x_desc0 = sw128_desc(x_tile(0));
    float acc[kAcc];
    float total[kAcc];

    // The scales of K block kb, loaded before the block's wgmmas are issued (the loads overlap them); with
    // two accumulator sets, a step earlier still.
    struct BlockScales {
      float w_block = 1.0f, w_row0 = 1.0f, w_row1 = 1.0f;
      float2 x_block[kBlockM / 8];
    };
    auto load_scales = [&](int kb) {
      BlockScales b;
      if constexpr (kScaleMode == 2) {
        const float* ws = p.w_group_scale + long(kb) * p.w_group_stride + wn;
        b.w_row0 = __ldg(ws);
        b.w_row1 = __ldg(ws + 8);
      }
      if constexpr (kBlockScale) {
        b.w_block = __ldg(p.w_block_scale + (w_base / 128) * p.num_kb + kb);
        const float* xs = p.x_block_scale + long(kb) * p.x_block_stride + m_tile * kBlockM + col;
#pragma unroll
        for (int j = 0; j < kBlockM / 8; ++j) b.x_block[j] = __ldg(reinterpret_cast<const float2*>(xs + 8 * j));
      }
      return b;
    };
    // Releases the oldest unreleased step's stage (its wgmmas are done; with ld.shared reads, this thread's too).
    auto release = [&]() {
      if (kReleasesPerWg == 128 || lane == 0) mbar_arrive(empty(released.stage));
      released.advance();
    };
    // Releases a finished step's stage and adds its partial sum `d` into the total.
    auto promote = [&](float (&d)[kAcc], const BlockScales& b) {
      fence_registers(d);
      release();
      accumulate_groups<kAcc / 4, kBlockScale, kScaleMode>(total, d, b);
    };
    // Token halves: adds the partial sum `d` of tokens 64 * half ... into the total.
    constexpr int kHalf = kAcc / 2;
    constexpr uint32_t kHalfDesc = 64 * kBK >> 4;  // a B descriptor's start address, 64 token rows on
    auto promote_half = [&](float (&d)[kHalf], int half, const BlockScales& b) {
      if constexpr (kTokenHalves) {
        fence_registers(d);
        if (half == 0) {
          accumulate_groups<kHalf / 4, kBlockScale, kScaleMode>(*reinterpret_cast<float(*)[kHalf]>(total), d, b);
        } else {
          accumulate_groups<kHalf / 4, kBlockScale, kScaleMode, kHalf / 4>(
              *reinterpret_cast<float(*)[kHalf]>(total + kHalf), d, b);
        }
      }
    };
    for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
      if (!locate(tile)) continue;
      wn = w_base + 64 * wg + row;
      const int n = n_tile * kBlockN + 64 * wg + row;  // output column
#pragma unroll
      for (int i = 0; i < kAcc; ++i) total[i] = 0.0f;
      [[maybe_unused]] float acc1[kAcc];  // the second set of kTwoAccumulators (dead code without)

      if constexpr (kWFormat == kE4m3) {
        // Waits for the next pipeline step and issues its wgmmas (both operands in shared memory) into d.
        // carry: add into d behind the wgmmas in flight on it (the promotion's second K block; d is not touched
        // in between, which would make ptxas wait for them); else the block's first wgmma overwrites d
        auto issue_ss = [&](float (&d)[kAcc], int carry) {
          mbar_wait(full(acquired.stage), acquired.phase);
          const uint64_t a_desc = w_desc0 + kStageDesc * acquired.stage;
          const uint64_t b_desc = x_desc0 + kStageDesc * acquired.stage;
          acquired.advance();
          if (!carry) fence_registers(d);
          wgmma_fence();
#pragma unroll
          for (int k = 0; k < kBK / 32; ++k) Wgmma<kBlockM>::mma(d, a_desc + 2 * k, b_desc + 2 * k, k + carry);
          wgmma_commit();
        };
        if constexpr (kTwoAccumulators) {
          two_sets(kb_begin, kb_count, load_scales, [&](int, int parity) {
            issue_ss(parity ? acc1 : acc, 0);
          }, promote, acc, acc1);
        } else if constexpr (kTokenHalves) {
          struct Operands {
            uint64_t a, b;
          };
          float h0[kHalf], h1[kHalf];
          token_halves(kb_begin, kb_count, load_scales, [&](int) {
            mbar_wait(full(acquired.stage), acquired.phase);
            const Operands ops{w_desc0 + kStageDesc * acquired.stage, x_desc0 + kStageDesc * acquired.stage};
            acquired.advance();
            return ops;
          }, [&](const Operands& ops, int, int half, float (&d)[kHalf]) {
            fence_registers(d);
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < kBK / 32; ++k) {
              Wgmma<kBlockM / 2>::mma(d, ops.a + 2 * k, ops.b + half * kHalfDesc + 2 * k, k);
            }
            wgmma_commit();
          }, [](int, int) {}, release, promote_half, h0, h1);
        } else if constexpr (kPromoteBlocks > 1) {
          // blocks i .. i + kPromoteBlocks - 1 into acc back to back, each issued behind the one before; a
          // block's stage released once its wgmmas are done; one promotion for all of them
          const BlockScales b{};
          for (int i = 0; i < kb_count; i += kPromoteBlocks) {
            issue_ss(acc, 0);
#pragma unroll
            for (int p = 1; p < kPromoteBlocks; ++p) {
              if (i + p < kb_count) {
                issue_ss(acc, 1);
                wgmma_wait<1>();
                release();  // step i + p - 1
              }
            }
            wgmma_wait<0>();
            promote(acc, b);  // the group's last step
          }
        } else {
          for (int i = 0; i < kb_count; ++i) {
            const BlockScales b = load_scales(kb_begin + i);
            issue_ss(acc, 0);
            wgmma_wait<0>();
            promote(acc, b);
          }
        }
      } else {
        uint32_t pos0 = 0, neg0 = 0;  // int4: the code table's register words (int4x8_to_e4m3)
        if constexpr (kWFormat == kInt4) {
          pos0 = lds_u32(base + L::kTable);
          neg0 = lds_u32(base + L::kTable + 4);
        }
        // This thread's codes of one K block (and MXFP4's table offsets), as read from shared memory.
        struct Codes {
          uint32_t words[8];
          uint32_t off0, off1;
        };
        // Waits for the next pipeline step and reads this thread's codes of it.
        auto load_codes = [&](Codes& c) {
          mbar_wait(full(acquired.stage), acquired.phase);
          // [warp][half][lane][16 bytes]: half h holds k-steps 2h, 2h + 1, two words each (k and k + 16)
          const uint32_t tile = w_tile(acquired.stage) + wg * L::kTile;
          acquired.advance();
          const uint32_t src = tile + warp * 1024 + lane * 16;
          const uint4 h0 = lds_v4(src), h1 = lds_v4(src + 512);
          c.words[0] = h0.x, c.words[1] = h0.y, c.words[2] = h0.z, c.words[3] = h0.w;
          c.words[4] = h1.x, c.words[5] = h1.y, c.words[6] = h1.z, c.words[7] = h1.w;
          if constexpr (kMx) {
            // byte k of each word: the table offset of k-step k for this thread's rows row and row + 8
            c.off0 = lds_u32(tile + kCodeBytes + 4 * row);
            c.off1 = lds_u32(tile + kCodeBytes + 4 * (row + 8));
          }
        };
        // Turns codes into e4m3 A fragments.
        auto decode = [&](const Codes& c, uint32_t (&a)[kBK / 32][4]) {
          if constexpr (kMx) {
#pragma unroll
            for (int k = 0; k < kBK / 32; ++k) {
              const MxTable t0 = mx_table(prmt(c.off0, 0u, 0x4440u + k));  // offset byte k alone
              const MxTable t1 = mx_table(prmt(c.off1, 0u, 0x4440u + k));
              e2m1x8_to_e4m3(c.words[2 * k], t0, t1, a[k][0], a[k][1]);      // rows row, row + 8; k .. k + 15
              e2m1x8_to_e4m3(c.words[2 * k + 1], t0, t1, a[k][2], a[k][3]);  // k + 16 ..
            }
          } else {
#pragma unroll
            for (int k = 0; k < kBK / 32; ++k) {
              int4x8_to_e4m3(c.words[2 * k], pos0, neg0, a[k][0], a[k][1]);      // rows row, row + 8; k .. k + 15
              int4x8_to_e4m3(c.words[2 * k + 1], pos0, neg0, a[k][2], a[k][3]);  // k + 16 ..
            }
          }
        };
        // Turns pipeline step i's codes into A fragments; every branch below converts the tile's steps in order,
        // once each. kPrefetchCodes: step i's codes were read by the conversion before (the tile's first below),
        // and this one reads step i + 1's once it has decoded step i's, so that the shared-memory loads' latency
        // passes during the wgmma issue and promotion that follow instead of stalling the decode.
        Codes ahead;
        auto convert = [&](int i, uint32_t (&a)[kBK / 32][4]) {
          if constexpr (kPrefetchCodes) {
            decode(ahead, a);
            if (i + 1 < kb_count) load_codes(ahead);  // step i + 1's
          } else {
            Codes c;
            load_codes(c);
            decode(c, a);
          }
        };
        if constexpr (kPrefetchCodes) {
          if (kb_count > 0) load_codes(ahead);
        }
        // Issues the wgmmas of the next pipeline step to issue (its codes converted into a); carry: as issue_ss's
        auto issue = [&](const uint32_t (&a)[kBK / 32][4], float (&d)[kAcc], int carry) {
          const uint64_t b_desc = x_desc0 + kStageDesc * issued.stage;
          issued.advance();
          if (!carry) fence_registers(d);
          wgmma_fence();
#pragma unroll
          for (int k = 0; k < kBK / 32; ++k) WgmmaRegA<kBlockM>::mma(d, a[k], b_desc + 2 * k, k + carry);
          wgmma_commit();
        };
        uint32_t a0[kBK / 32][4], a1[kBK / 32][4];
        if constexpr (kTwoAccumulators) {
          // each step converted into the A fragments of its parity while the previous step's wgmmas run
          two_sets(kb_begin, kb_count, load_scales, [&](int i, int parity) {
            auto& a = parity ? a1 : a0;
            convert(i, a);
            issue(a, parity ? acc1 : acc, 0);
          }, promote, acc, acc1);
        } else if constexpr (kPromoteBlocks > 1) {
          // Blocks i .. i + kPromoteBlocks - 1 into acc: block i + p is converted into A fragment set p while
          // block i + p - 1's wgmmas run and issued behind them; once those are done (wait<1>) block i + p - 1's
          // stage is released. The next group's first block is converted into set 0 while the group's last
          // runs; then one promotion for the group. A set per block: ptxas serialises the wgmmas where
          // registers an in-flight chain of wgmmas read are written and read again before it is waited on,
          // and where anything stays in flight across the loop.
          uint32_t ap[kPromoteBlocks][kBK / 32][4];
          const BlockScales b{};
          if (kb_count > 0) convert(0, ap[0]);
          for (int i = 0; i < kb_count; i += kPromoteBlocks) {
            issue(ap[0], acc, 0);
#pragma unroll
            for (int p = 1; p < kPromoteBlocks; ++p) {
              if (i + p < kb_count) {
                convert(i + p, ap[p]);
                issue(ap[p], acc, 1);
                wgmma_wait<1>();
                release();  // step i + p - 1
              }
            }
            if (i + kPromoteBlocks < kb_count) convert(i + kPromoteBlocks, ap[0]);
            wgmma_wait<0>();
            promote(acc, b);  // the group's last step
          }
        } else if constexpr (kTokenHalves) {
          float h0[kHalf], h1[kHalf];
          token_halves(kb_begin, kb_count, load_scales, [&](int) {
            const uint64_t desc = x_desc0 + kStageDesc * issued.stage;
            issued.advance();
            return desc;
          }, [&](uint64_t desc, int parity, int half, float (&d)[kHalf]) {
            const auto& a = parity ? a1 : a0;
            fence_registers(d);
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < kBK / 32; ++k) WgmmaRegA<kBlockM / 2>::mma(d, a[k], desc + half * kHalfDesc + 2 * k, k);
            wgmma_commit();
          }, [&](int i, int parity) { convert(i, parity ? a1 : a0); }, release, promote_half, h0, h1);
        } else {
          // Two register sets of A fragments: step i + 1 is converted while the wgmmas of step i run (unrolled
          // by two so that each set is fixed registers; each conversion in its own block, so that ptxas keeps
          // the wgmma wait after it).
          BlockScales b0, b1;
          if (kb_count > 0) convert(0, a0);
          for (int i = 0; i < kb_count; i += 2) {
            b0 = load_scales(kb_begin + i);
            issue(a0, acc, 0);
            if (i + 1 < kb_count) convert(i + 1, a1);
            wgmma_wait<0>();
            promote(acc, b0);
            if (i + 1 >= kb_count) break;
            b1 = load_scales(kb_begin + i + 1);
            issue(a1, acc, 0);
            if (i + 2 < kb_count) convert(i + 2, a0);
            wgmma_wait<0>();
            promote(acc, b1);
          }
        }
      }

      // Epilogue: this thread holds channels n and n + 8, tokens 8 j + col + {0, 1}.
      float ws0 = 1.0f, ws1 = 1.0f, b0 = 0.0f, b1 = 0.0f;
      if constexpr (kScaleMode == 0) {
        ws0 = p.w_scale[wn];
        ws1 = p.w_scale[wn + 8];
      }
      if (p.bias != nullptr && (!kSplitK || blockIdx.z == 0)) {  // split-K: split 0 adds the bias
        const long bias_row = long(expert) * p.N;
        b0 = load_float<B>(p.bias, bias_row + min(n, p.N - 1));
        b1 = load_float<B>(p.bias, bias_row + min(n + 8, p.N - 1));
      }
      const uint32_t slab = out_base + wg * L::kOutSlab;
      const int token_row = lane % 8;         // stmatrix row address of this lane (lanes 0-15)
      const int chunk = 2 * warp + (lane / 8) % 2;  // its 16-byte chunk (8 channels) in the 128-byte row
      if constexpr (kTmaStore) {
        if (tile != int(blockIdx.x)) {  // the store of the block's previous tile has read the slab
          if (tid == 0) tma_store_wait_read();
          named_barrier_sync(1 + wg, 128);
        }
      }
#pragma unroll
      for (int j = 0; j < kBlockM / 8; ++j) {
        float xs0 = 1.0f, xs1 = 1.0f;
        if constexpr (!kBlockScale) {
          const int t = m_tile * kBlockM + 8 * j + col;
          xs0 = p.x_scale[min(t, p.M - 1) * p.x_scale_stride];
          xs1 = p.x_scale[min(t + 1, p.M - 1) * p.x_scale_stride];
        }
        const float v00 = total[4 * j + 0] * ws0 * xs0 + b0;  // (channel n, token t)
        const float v01 = total[4 * j + 1] * ws0 * xs1 + b0;  // (n, t + 1)
        const float v10 = total[4 * j + 2] * ws1 * xs0 + b1;  // (n + 8, t)
        const float v11 = total[4 * j + 3] * ws1 * xs1 + b1;  // (n + 8, t + 1)
        if constexpr (kTmaStore) {
          const int token = 8 * j + token_row;
          stmatrix_x2_trans(slab + token * 128 + ((chunk ^ (token % 8)) << 4), pack2<O>(v00, v01), pack2<O>(v10, v11));
        } else {
          const int t = m_tile * kBlockM + 8 * j + col;
          // the read-back's workspace has rows of N
          const long stride = kReadBack ? long(p.N) : long(p.out_stride), row0 = long(t) * stride, row1 = row0 + stride;
          auto put = [&](long at, float v) {
            if constexpr (kReadBack) {
              red_add_f32(p.sums + at, v);
            } else if constexpr (kSplitK) {
              red_add_f32(static_cast<float*>(p.out) + at, v);
            } else {
              store_float<O>(p.out, at, v);
            }
          };
          if (t < p.M && n < p.N) put(row0 + n, v00);
          if (t + 1 < p.M && n < p.N) put(row1 + n, v01);
          if (t < p.M && n + 8 < p.N) put(row0 + n + 8, v10);
          if (t + 1 < p.M && n + 8 < p.N) put(row1 + n + 8, v11);
        }
      }
      if constexpr (kReadBack) {
        // Count this split in once all its consumers' adds are visible; the last split to arrive reads the tile's
        // totals back, at L2 where the adds went, restoring the zeros, and writes them in O.
        __threadfence();
        named_barrier_sync(1 + kWgs, 128 * kWgs);  // every consumer's adds are fenced before the arrival
        const int counter = m_tile * p.tiles_n + n_tile;
        const bool arrived_last = threadIdx.x == 0 && atomicAdd(p.arrivals + counter, 1) == int(gridDim.z) - 1;
        if (named_barrier_or(1 + kWgs, 128 * kWgs, arrived_last)) {
          __threadfence();  // every other split's adds happened before its arrival, which this split saw
#pragma unroll
          for (int j = 0; j < kBlockM / 8; ++j) {
            const int t = m_tile * kBlockM + 8 * j + col;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int token = t + (e & 1), channel = n + 8 * (e >> 1);
              if (token < p.M && channel < p.N) {
                const float total_value = atomicExch(p.sums + long(token) * p.N + channel, 0.0f);
                store_float<O>(p.out, long(token) * p.out_stride + channel, total_value);
              }
            }
          }
          if (threadIdx.x == 0) p.arrivals[counter] = 0;
        }
      }
      if constexpr (kTmaStore) {
        fence_proxy_async();
        named_barrier_sync(1 + wg, 128);
        if (tid == 0) {
          tma_store_2d(&p.out_map, slab, n_tile * kBlockN + 64 * wg, m_tile * kBlockM);
          tma_store_commit();
        }
      }
    }
    if constexpr (kTmaStore) {
      if (tid == 0) tma_store_wait_read();  // the last store has read the slab before the block exits
    }
  }
}

}  // namespace fp8_sm90
}  // namespace humming
