// Hopper (sm_90a) weight-only GEMM for large M: out[M, N] = x[M, K] @ dequant(W[N, K])^T.
//
// The kernel computes out^T tile by tile so that the quantized weights are the wgmma A operand, which
// Hopper lets come from registers: the weights never go through shared memory in 16-bit form.
// - Block tile: 128 weight rows x kBM (a multiple of 16 up to 256) tokens, K in 64-column chunks;
//   3 warpgroups (384 threads): warpgroup 0 is the producer (one thread issues all copies,
//   setmaxnreg.dec to 40 registers), warpgroups 1 and 2 are consumers of 64 rows each (setmaxnreg.inc
//   to 232). With kBlocksPerSm = 2 (small token tiles, whose consumers need few registers) each thread
//   starts with 80 registers: the producer drops to 24 and the consumers rise to 104.
// - Each pipeline stage holds one chunk: the activation tile (kBM x 64, loaded by TMA with the
//   128-byte swizzle wgmma expects), the weight chunk of the 128 rows (4 or 8 KB contiguous in the
//   fragment layout, one bulk copy), the 128 scales and zero points of the chunk's group (bulk copies),
//   all completing on the stage's "full" mbarrier; consumers release it on the stage's "empty" one.
// - Consumers load their lane's 16-byte weight fragment from shared memory, dequantize it in registers
//   (magic-number lop3 / prmt, zero point, then the group scale in 16-bit float: w = (q - z) * s is
//   rounded once, as humming.dequantize does), and issue four m64nkBMk16 wgmma (A = registers,
//   B = shared-memory descriptor), fp32 accumulators in registers. Two chunks' wgmmas are in flight:
//   chunk i + 1's are queued behind chunk i's, and once chunk i's are done chunk i + 2 is dequantized into
//   their A registers while chunk i + 1's run (the tensor cores never drain between chunks).
// - MXFP4 (e2m1 codes, S = e8m0 / e8m0_any, bf16 only): dequant_e2m1, then each 32-column half times its
//   own e8m0 scale in bf16. Both factors are powers of two times at most 2 significant bits, so the bf16
//   product is exact (bf16 has fp32's exponent range; 2^-127, code 0, is a bf16 subnormal). The chunk's
//   scale bytes per row pair are (row g, row g + 8) of its first 32 columns, then of its last 32: the
//   same 256 bytes per 128-row block as 16-bit scales.
// - Integer codes in groups of 32 (S = bf16_halves / f16_halves, Kimi-K2's int4 g32): each chunk has two
//   16-bit scales per row, one per 32-column half (4 bytes per row, as f32 scales), k16 steps 0-1 taking the
//   first and 2-3 the second; each product rounded once, as with one scale per chunk.
// - Grouped (MoE) variant, kGrouped: the weights are E experts stacked as extra 128-row blocks
//   (expert e's block b is block e * N/128 + b, likewise for scales and zero points, bias [E, N]; with
//   kTileGroup 1, expert e's 16-row tile t is tile e * N/16 + t); x
//   rows are grouped by expert in segments of block_m rows (kBM divides block_m), and expert_ids[i] is
//   the expert of rows [i * block_m, (i + 1) * block_m), -1 for unused segments, whose tiles return at once.
// - Gathering grouped variant, kGather: grouped row r is token rows[r] of x [T, K] (zeros where rows[r] is
//   -1), read in place: the whole producer warpgroup copies the tile's rows with 16-byte cp.async into the
//   128-byte-swizzled layout the TMA would have written (16-byte column c of row r at c ^ (r % 8)); each
//   thread's cp.async.mbarrier.arrive counts it in on the chunk's full barrier once its copies have landed
//   (129 arrivals: thread 0's expect_tx for the weight copies, and each producer thread's), so the producer
//   never waits on its own copies and a chunk is ready as soon as its data is. Consumers fence the chunk to
//   the async proxy (wgmma reads it there) after the wait (MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC per consumer
//   thread and chunk). With kArriveLag = L > 0 the producer threads instead commit each step's copies as a
//   group, wait for the group of step - L, fence those rows themselves and arrive: the fence leaves the
//   consumers' path, and a chunk is ready L steps after its copies were issued at the earliest.
// - Gated epilogue (grouped only), kAct: the weights' rows are fused_moe's w13 in gate-up order (within each
//   16-row tile, rows g are gates and rows g + 8 the ups of the same 8 features: gate_up_rows in _layout.py),
//   so each thread holds a feature's gate and up sums; it writes act(gate, up) to out [M, N / 2], each input
//   rounded to O first (as the unfused GEMM's output), the activation in fp32 (humming.reference.moe_layer).
// - Ragged rows, kTileGroup = 1 (N % 128 != 0, N % 16 == 0: the layout's 16-row tiles are not grouped in
//   eights, _layout.tile_group): a 128-row block is 8 separate 16-row tiles, each chunk of them K / 64
//   chunks apart, the last block of the weight (of each expert) holding only N % 128 / 16 of them. Weights,
//   scales and zero points are each one 2-D TMA box of 8 tile rows (w_map, s_map, z_map: one row per 16-row
//   tile, a chunk's or group's bytes of it as uint32 columns, no swizzle): rows past the last expert's are
//   zero-filled, those past N in other experts are the next expert's tiles; the consumer warps of the tiles
//   past N compute on them and store nothing.
// - Split-K (dense only), kSplitK: blockIdx.z takes chunks [z * C / splits, (z + 1) * C / splits) of the
//   C = K / 64; each block red.adds its fp32 sums into a workspace [M, N] and counts itself in at the tile's
//   arrival counter; the block that arrives last reads the totals back (atomicExch, which leaves zeros),
//   applies the epilogue and resets the counter: the workspace is zero between calls (no memset). The
//   order of the adds varies, so results vary in the last bits of fp32 from call to call.
// - Programmatic launch (sm_90): the block lets the kernel launched behind it start at once; it waits for the
//   kernel before it (grid_dependency_wait) before reading x (dense: behind humming's activation pass) or,
//   grouped (launched so behind any kernel), before reading anything.
#include "humming/dequant.cuh"
#include "humming/sm90_ptx.cuh"

namespace humming {
namespace gemm_sm90 {

using sm90::TensorMap;

struct alignas(64) Params {
  TensorMap x_map;       // x [M, K], box 64 x kBM, 128-byte swizzle
  TensorMap w_map;       // kTileGroup 1: qweight as [tiles, K/64 chunks x words], box (a chunk's words) x 8
  TensorMap s_map;       // kTileGroup 1: scales as [tiles, groups x 16 entries], box (a group's words) x 8
  TensorMap z_map;       // kTileGroup 1: zeros as scales, or unused
  const uint4* qweight;  // fragment layout, tile group kTileGroup
  const void* scales;    // [N/16/kTileGroup, groups, kTileGroup, 8, 2]
  const uint16_t* zeros; // [N/16/kTileGroup, groups, kTileGroup, 8, 2] or null
  const void* bias;      // [N] ([E, N] grouped) or null
  void* out;             // [M, N], row stride out_stride
  const int* expert_ids; // grouped: [M / block_m], -1 = skip; else null
  int M, N, K;
  int out_stride;
  int groups;
  int chunks_per_group;
  int block_m;           // grouped: rows per expert_ids entry
  const float* x_scale;  // per-token (x_scale_stride 1) or per-tensor (0) activation scale, or null: x holds
  int x_scale_stride;    // quantized activations' values (fp8 schemes run through the 16-bit kernels)
  const void* x;         // kGather: the tokens [T, K], row stride x_stride elements
  const int* rows;       // kGather: [M] token of each grouped row, -1 = padding
  int x_stride;
  int splits;            // kSplitK: K splits (gridDim.z)
  float* sums;           // kSplitK: [M, N] fp32, zero between calls
  int* arrivals;         // kSplitK: [gridDim.y * gridDim.x] counters, zero between calls
  float act_alpha;       // kAct == kSwigluOai: the sigmoid's slope and the clamp bound
  float act_limit;
  int gate_up_interleaved;  // kAct: the bias's gate / up columns are 2f / 2f + 1 (else f / N / 2 + f)
};

template <int kBits, int kZero, DType S, int kBM, int kStages>
struct SmemLayout {
  static constexpr int kXBytes = kBM * 128;                 // activation tile, 1024-byte aligned
  static constexpr int kWBytes = 128 * 64 * kBits / 8;      // weight chunk of 128 rows
  // f32 scales, or two 16-bit scales per row (groups of 32: each chunk's two halves): 4 bytes per row
  static constexpr int kSBytes = 128 * (S == DType::f32 || S == DType::bf16_halves || S == DType::f16_halves ? 4 : 2);
  static constexpr int kZBytes = kZero < 0 ? 128 * 2 : 0;
  static constexpr int kX = 0;
  static constexpr int kW = kX + kStages * kXBytes;
  static constexpr int kS = kW + kStages * kWBytes;
  static constexpr int kZ = kS + kStages * kSBytes;
  static constexpr int kBar = kZ + kStages * kZBytes;       // full[kStages], empty[kStages]
  static constexpr int kFlag = kBar + 2 * kStages * 8;     // kSplitK: the "last block of the tile" flag
  static constexpr int kTotal = kFlag + 16;                 // (GemmTuning.smem_bytes counts it with splits)
};

template <DType A, int kBits, int kZero, DType S, DType O, DType B, int kBM, int kStages, bool kGrouped,
          bool kGather, bool kSplitK, int kBlocksPerSm, bool kPersistent, int kAct, int kArriveLag,
          int kTileGroup = 8>
__device__ __forceinline__ void run(const Params& p) {
  static_assert(kAct == kNoAct || (kGrouped && !kSplitK), "the gated epilogue is the grouped kernel's");
  static_assert(kAct == kNoAct || O != DType::f32, "the gated epilogue rounds gate and up to a 16-bit O");
  static_assert(kBlocksPerSm == 1 || kBlocksPerSm == 2, "one or two blocks per SM");
  static_assert(!(kSplitK && kPersistent), "split-K blocks own one tile's share of K each");
  static_assert(!kGather || kGrouped, "the gather reads grouped rows");
  static_assert(kArriveLag == 0 || (kGather && kArriveLag > 0 && kArriveLag <= kStages - 2),
                "an arrival lag is the gather's, at most kStages - 2 (consumers release a stage after acquiring the next)");
  static_assert(!(kSplitK && kGrouped), "split-K is a dense schedule");
  static_assert(kTileGroup == 8 || (kTileGroup == 1 && kAct == kNoAct), "tile groups of 8, or 1 without the gated epilogue");
  // 128 * producer + 256 * consumer registers must fit the 384 * (65536 / 384 / kBlocksPerSm, rounded
  // down to 8) the block launches with (168 or 80 per thread).
  constexpr int kProducerRegs = kBlocksPerSm == 1 ? 40 : 24;
  constexpr int kConsumerRegs = kBlocksPerSm == 1 ? 232 : 104;
  constexpr bool kE2m1 = S == DType::e8m0 || S == DType::e8m0_any;
  constexpr bool k16Halves = S == DType::bf16_halves || S == DType::f16_halves;
  static_assert(!kE2m1 || (kBits == 4 && kZero == 0 && A == DType::bf16), "MXFP4: e2m1 codes, bf16 activations");
  using L = SmemLayout<kBits, kZero, S, kBM, kStages>;
  constexpr int kVecs = kBits / 4;
  constexpr uint32_t kStageTx = (kGather ? 0 : L::kXBytes) + L::kWBytes + L::kSBytes + L::kZBytes;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // The dynamic shared memory base is only 16-byte aligned by default: align to 1024 by hand
  // (decode.py reserves the slack).
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t full0 = base + L::kBar, empty0 = full0 + kStages * 8;

  const int wg = threadIdx.x / 128;
  const int n_blocks = (p.N + 127) / 128, m_tiles = (p.M + kBM - 1) / kBM;
  // The block's tiles: (blockIdx.x, blockIdx.y), or with kPersistent tiles blockIdx.x, + gridDim.x, ... of
  // the n_blocks * m_tiles. Dense: in (n block, m tile) order, so that the tiles of one weight block run
  // together. Grouped: in (m tile, n block) order: the routing's used segments come first (moe_align pads
  // at the end), so a decode call's few used tiles fall one per block rather than several on the blocks
  // whose strides they happen to share; the tiles of one segment still run together.
  const int first_tile = kPersistent ? int(blockIdx.x) : 0;
  const int tile_end = kPersistent ? n_blocks * m_tiles : 1;
  const int tile_step = kPersistent ? int(gridDim.x) : 1;
  auto n_block_of = [&](int t) {
    return !kPersistent ? int(blockIdx.x) : kGrouped ? t % n_blocks : t / m_tiles;
  };
  auto m_tile_of = [&](int t) {
    return !kPersistent ? int(blockIdx.y) : kGrouped ? t / n_blocks : t % m_tiles;
  };
  // The expert of a tile's rows (-1: an unused segment, skipped by every thread alike).
  auto expert_of = [&](int t) { return kGrouped ? p.expert_ids[m_tile_of(t) * kBM / p.block_m] : 0; };
  launch_dependents();  // a kernel launched programmatically behind this one starts (and waits) now
  // Grouped: launched programmatically behind any kernel, so wait before reading anything (expert ids first)
  if constexpr (kGrouped) grid_dependency_wait();
  if (!kPersistent && expert_of(0) < 0) return;  // the whole block: before any barrier
  const int n_chunks = p.K / 64;
  // Each tile's chunks: [k_begin, k_begin + count) (all of K but with kSplitK; the host keeps count >= 1)
  const int k_begin = kSplitK ? int(blockIdx.z) * n_chunks / p.splits : 0;
  const int count = kSplitK ? (int(blockIdx.z) + 1) * n_chunks / p.splits - k_begin : n_chunks;

  // Both sides wait on a barrier by spinning in C++ around mbar_try_wait, not with sm90::mbar_wait (which
  // spins inside PTX): with the loop visible the compiler keeps the pipeline loops rolled, where the PTX spin
  // lets it peel the producer's first kStages iterations and unroll the consumers' loop of the two-blocks-
  // per-SM build.
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(full0 + 8 * s, kGather ? 1 + 128 : 1);
      sm90::mbar_init(empty0 + 8 * s, 256);
    }
    sm90::fence_mbar_init();
  }
  __syncthreads();

  if (wg == 0) {
    sm90::setmaxnreg_dec<kProducerRegs>();
    grid_dependency_wait();  // behind humming's activation pass (programmatic launch): x is its output
    // kGather: this thread copies 16-byte column c of the tile's rows r0 + 16 j, their tokens read again for
    // each chunk (L1 hits) rather than held: the producer has 24 or 40 registers.
    [[maybe_unused]] const int c = threadIdx.x % 8, r0 = threadIdx.x / 8;
    [[maybe_unused]] const int n_tiles = p.N / 16;  // kTileGroup 1: the weight's 16-row tiles, per expert
    if (kGather || threadIdx.x == 0) {
      const char* w_src = reinterpret_cast<const char*>(p.qweight);
      const char* s_src = static_cast<const char*>(p.scales);
      const char* z_src = reinterpret_cast<const char*>(p.zeros);
      int step = 0;                // the pipeline's step, counted over the block's tiles
      sm90::RingPos<kStages> at;  // its place in the stage ring
      for (int ti = first_tile; ti < tile_end; ti += tile_step) {
        const int expert = expert_of(ti);
        if (expert < 0) continue;
        const int m0 = m_tile_of(ti) * kBM;                  // first token of the tile
        const int blk = expert * n_blocks + n_block_of(ti);  // 128-row block of the (stacked) weights
        for (int i = 0; i < count; ++i, ++step, at.advance()) {  // kc: the chunk of K step `step` loads
          const int kc = k_begin + i, s = at.stage;
          if (step >= kStages) {  // the stage's previous turn is released
            while (!sm90::mbar_try_wait(empty0 + 8 * s, at.phase ^ 1)) {}
          }
          const uint32_t full = full0 + 8 * s;
          if constexpr (kTileGroup == 8) {
            if (threadIdx.x == 0) {
              sm90::mbar_expect_tx(full, kStageTx);
              if constexpr (!kGather) sm90::tma_load_2d(base + L::kX + s * L::kXBytes, &p.x_map, full, kc * 64, m0);
              sm90::bulk_load(base + L::kW + s * L::kWBytes, w_src + (long(blk) * n_chunks + kc) * L::kWBytes, L::kWBytes, full);
              const long group_block = long(blk) * p.groups + kc / p.chunks_per_group;
              sm90::bulk_load(base + L::kS + s * L::kSBytes, s_src + group_block * L::kSBytes, L::kSBytes, full);
              if constexpr (kZero < 0) {
                sm90::bulk_load(base + L::kZ + s * L::kZBytes, z_src + group_block * L::kZBytes, L::kZBytes, full);
              }
            }
          } else if (threadIdx.x == 0) {
            // The block's 8 tile rows from its first (TMA boxes count their zero-filled bytes too).
            const int tile_row = expert * n_tiles + n_block_of(ti) * 8, group = kc / p.chunks_per_group;
            sm90::mbar_expect_tx(full, kStageTx);
            if constexpr (!kGather) sm90::tma_load_2d(base + L::kX + s * L::kXBytes, &p.x_map, full, kc * 64, m0);
            sm90::tma_load_2d(base + L::kW + s * L::kWBytes, &p.w_map, full, kc * (L::kWBytes / 32), tile_row);
            sm90::tma_load_2d(base + L::kS + s * L::kSBytes, &p.s_map, full, group * (L::kSBytes / 32), tile_row);
            if constexpr (kZero < 0) {
              sm90::tma_load_2d(base + L::kZ + s * L::kZBytes, &p.z_map, full, group * (L::kZBytes / 32), tile_row);
            }
          }
          if constexpr (kGather) {
            const char* x_src = static_cast<const char*>(p.x) + (kc * 64 + c * 8) * 2;
#pragma unroll
            for (int j = 0; j < kBM / 16; ++j) {
              const int r = r0 + 16 * j, token = __ldg(p.rows + m0 + r);
              const uint32_t dst = base + L::kX + s * L::kXBytes + r * 128 + ((c ^ (r & 7)) << 4);
              cp_async_cg16_zfill(dst, x_src + long(token < 0 ? 0 : token) * p.x_stride * 2, token >= 0);
            }
            if constexpr (kArriveLag == 0) {
              sm90::cp_async_mbar_arrive_noinc(full);  // arrives once this thread's copies have landed
            } else {  // the copies of step - kArriveLag have landed: fence them for wgmma, then arrive
              cp_async_commit();
              if (step >= kArriveLag) {
                cp_async_wait<kArriveLag>();
                sm90::fence_proxy_async();
                sm90::mbar_arrive(full0 + 8 * ((step - kArriveLag) % kStages));
              }
            }
          }
        }
      }
      if constexpr (kArriveLag > 0) {  // the last steps' arrivals
        cp_async_wait<0>();
        sm90::fence_proxy_async();
        for (int i = step < kArriveLag ? 0 : step - kArriveLag; i < step; ++i) {
          sm90::mbar_arrive(full0 + 8 * (i % kStages));
        }
      }
    }
  } else {
    sm90::setmaxnreg_inc<kConsumerRegs>();
    grid_dependency_wait();  // and so are x's scales, which the epilogue reads
    const int t = threadIdx.x - 128;      // 0..255 over both consumer warpgroups
    const int tile = t / 32;              // 16-row tile of the block: warp w of consumer c has 4c + w
    const int lane = t & 31;
    const int g = lane >> 2, c = lane & 3;
    constexpr float kMagicF = kBits == 8 && A == DType::bf16 ? 8388608.0f : (A == DType::bf16 ? 128.0f : 1024.0f);
    constexpr uint32_t kNegZero = 0x80008000u;
    float acc[kBM / 2];
    // The four k16 steps of this lane's fragment of stage s (words) into a: integer codes, w = (q - z) * s
    // rounded once to the activation type.
    auto dequant_int = [&](int s, const uint32_t* words, uint32_t (&a)[4][4]) {
      float s_g, s_g8;
      uint32_t half_scales[2][2];  // k16Halves: [half][row g, row g + 8] of the chunk's two 32-column groups
      if constexpr (k16Halves) {
        // per row pair: (half 0: row g, row g + 8), (half 1: row g, row g + 8), 16 bits each
        constexpr DType H = S == DType::bf16_halves ? DType::bf16 : DType::f16;
        const uint2 sp = reinterpret_cast<const uint2*>(smem + L::kS + s * L::kSBytes)[tile * 8 + g];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t pair = h ? sp.y : sp.x;
          const float lo = to_float<H>(uint16_t(pair & 0xffff)), hi = to_float<H>(uint16_t(pair >> 16));
          half_scales[h][0] = pack2<A>(lo, lo);
          half_scales[h][1] = pack2<A>(hi, hi);
        }
        s_g = s_g8 = 0.0f;
      } else if constexpr (S == DType::f32) {
        const float2 sp = reinterpret_cast<const float2*>(smem + L::kS + s * L::kSBytes)[tile * 8 + g];
        s_g = sp.x;
        s_g8 = sp.y;
      } else {
        const uint32_t sp = reinterpret_cast<const uint32_t*>(smem + L::kS + s * L::kSBytes)[tile * 8 + g];
        s_g = to_float<S>(uint16_t(sp & 0xffff));
        s_g8 = to_float<S>(uint16_t(sp >> 16));
      }
      float zf_g = kMagicF + kZero, zf_g8 = kMagicF + kZero;
      if constexpr (kZero < 0) {
        const uint32_t zp = reinterpret_cast<const uint32_t*>(smem + L::kZ + s * L::kZBytes)[tile * 8 + g];
        zf_g = kMagicF + float(zp & 0xffff);
        zf_g8 = kMagicF + float(zp >> 16);
      }
      const uint32_t bias_g = pack2<A>(-zf_g, -zf_g), bias_g8 = pack2<A>(-zf_g8, -zf_g8);
      const uint32_t scale_g = pack2<A>(s_g, s_g), scale_g8 = pack2<A>(s_g8, s_g8);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (kBits == 4) {
          dequant4<A>(words[j], bias_g, bias_g8, a[j]);
        } else {
          dequant8<A>(words[2 * j], words[2 * j + 1], zf_g, zf_g8, bias_g, bias_g8, a[j]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint32_t scale = k16Halves ? half_scales[j >> 1][i & 1] : (i & 1) ? scale_g8 : scale_g;
          a[j][i] = fma2<A>(a[j][i], scale, kNegZero);
        }
      }
    };
    // The same for MXFP4: e2m1 values (exact), each 32-column half times its e8m0 scale (exact in bf16).
    auto dequant_mxfp4 = [&](int s, const uint32_t* words, uint32_t (&a)[4][4]) {
      // Byte b of the row pair's word: half b / 2 (first / last 32 columns), row g + 8 * (b % 2).
      const uint32_t sp = reinterpret_cast<const uint32_t*>(smem + L::kS + s * L::kSBytes)[tile * 8 + g];
      uint32_t scale[4];
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const uint32_t code = (sp >> (8 * b)) & 0xff;
        const float f = S == DType::e8m0 ? __uint_as_float(code << 23) : e8m0_to_float(code);
        scale[b] = pack2<A>(f, f);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        dequant_e2m1<A>(words[j], a[j]);
#pragma unroll
        for (int i = 0; i < 4; ++i) a[j][i] = fma2<A>(a[j][i], scale[2 * (j >> 1) + (i & 1)], kNegZero);
      }
    };
    // Every pipeline step is waited for, issued and released once, each in step order: a ring position for each.
    sm90::RingPos<kStages> acquired, issued, released;
    // Wait for the next pipeline step, load this lane's weight fragment of it and dequantize it.
    auto load_dequant = [&](uint32_t (&a)[4][4]) {
      const int s = acquired.stage;
      while (!sm90::mbar_try_wait(full0 + 8 * s, acquired.phase)) {}
      acquired.advance();
      // the gathered rows, written by cp.async, read by wgmma (with kArriveLag the producer fenced them)
      if constexpr (kGather && kArriveLag == 0) sm90::fence_proxy_async();
      const uint4* w = reinterpret_cast<const uint4*>(smem + L::kW + s * L::kWBytes) + tile * kVecs * 32 + lane;
      uint4 wv[kVecs];
#pragma unroll
      for (int v = 0; v < kVecs; ++v) wv[v] = w[v * 32];
      const uint32_t* words = reinterpret_cast<const uint32_t*>(&wv[0]);
      if constexpr (kE2m1) {
        dequant_mxfp4(s, words, a);
      } else {
        dequant_int(s, words, a);
      }
    };
    // The wgmmas of the next pipeline step to issue; the tile's first step (`first`) overwrites the accumulators.
    // Stage s's activation tile descriptor is stage 0's plus s tiles (the start address field, in 16-byte units,
    // stays below 2^14: shared memory addresses are below 256 KiB).
    const uint64_t x_desc0 = sm90::sw128_desc(base + L::kX);
    auto issue_mma = [&](bool first, const uint32_t (&a)[4][4]) {
      const uint64_t desc = x_desc0 + (L::kXBytes >> 4) * issued.stage;
      issued.advance();
      sm90::wgmma_fence();
#pragma unroll
      for (int j = 0; j < 4; ++j) sm90::wgmma_rs<A, kBM>(acc, a[j], desc + 2 * j, !first || j > 0);
      sm90::wgmma_commit();
    };
    // Two register sets for the dequantized A operand, and two chunks of wgmmas in flight: chunk i + 1's are
    // issued behind chunk i's before waiting for chunk i alone (wgmma_wait<1>), so that the tensor cores
    // go from one chunk to the next without draining; chunk i + 2 is then dequantized into chunk i's
    // registers while chunk i + 1's wgmmas run. The loop is unrolled by two so that each set is a fixed set
    // of registers (ptxas serializes wgmmas whose register inputs are written while they are in flight).
    uint32_t a0[4][4], a1[4][4];
    // Releases the oldest unreleased step's stage.
    auto release = [&]() {
      sm90::mbar_arrive(empty0 + 8 * released.stage);
      released.advance();
    };
    for (int ti = first_tile; ti < tile_end; ti += tile_step) {
      const int expert = expert_of(ti);
      if (expert < 0) continue;
      const int m0 = m_tile_of(ti) * kBM;  // first token of the tile
      load_dequant(a0);
      issue_mma(true, a0);
      if (count > 1) load_dequant(a1);
      // Every exit from the loop follows a wgmma_wait<0> (ptxas would otherwise add a wait of its own before the
      // epilogue reads the accumulators).
      for (int i = 0;; i += 2) {  // here chunk i's wgmmas (a0) are in flight, a1 holds chunk i + 1
        if (i + 1 < count) {
          issue_mma(false, a1);
          sm90::wgmma_wait<1>();
          release();  // chunk i
        } else {
          sm90::wgmma_wait<0>();
          release();
          break;
        }
        if (i + 2 < count) {
          load_dequant(a0);
          issue_mma(false, a0);
          sm90::wgmma_wait<1>();
          release();  // chunk i + 1
        } else {
          sm90::wgmma_wait<0>();
          release();
          break;
        }
        if (i + 3 < count) load_dequant(a1);
      }
      // acc[4i + e]: weight row tile*16 + g + 8 * (e >> 1), token m0 + 8i + 2c + (e & 1).
      const long n_base = long(n_block_of(ti)) * 128 + tile * 16 + g;  // column of out (row of the expert)
      // kTileGroup 1: this warp's 16 rows lie past the expert's N rows (the last block's missing tiles)
      const bool past_n = kTileGroup == 1 && n_base - g >= p.N;
      if constexpr (kSplitK) {
#pragma unroll
        for (int i = 0; i < kBM / 8; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int token = m0 + 8 * i + 2 * c + (e & 1);
            if (token < p.M && !past_n) red_add_f32(p.sums + long(token) * p.N + n_base + 8 * (e >> 1), acc[4 * i + e]);
          }
        __threadfence();  // this thread's adds are visible before the block's arrival below
        // the flag in dynamic shared memory: a static __shared__ would add a whole 1 KiB-aligned segment
        volatile int* last = reinterpret_cast<volatile int*>(smem + L::kFlag);
        sm90::named_barrier_sync(1, 256);  // both consumer warpgroups
        const int counter = blockIdx.y * gridDim.x + blockIdx.x;
        if (t == 0) *last = atomicAdd(p.arrivals + counter, 1) == p.splits - 1;
        sm90::named_barrier_sync(1, 256);
        if (!*last) return;
        __threadfence();  // every other block's adds happened before its arrival, which this block saw
#pragma unroll
        for (int i = 0; i < kBM / 8; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int token = m0 + 8 * i + 2 * c + (e & 1);
            // atomicExch reads the total at L2, where the adds went, and restores the zero.
            if (token < p.M && !past_n) acc[4 * i + e] = atomicExch(p.sums + long(token) * p.N + n_base + 8 * (e >> 1), 0.0f);
          }
        if (t == 0) p.arrivals[counter] = 0;
      }
      if constexpr (kAct != kNoAct) {
        // Gate-up rows (gate_up_rows in _layout.py): row g of the 16-row tile is the gate of feature
        // f = 64 * block + 8 * tile + g, row g + 8 its up; out is [M, N / 2]. Each is rounded to O as the
        // unfused GEMM's output would be, then activated in fp32.
        const int inter = p.N / 2, f = n_block_of(ti) * 64 + tile * 8 + g;
        const long gate_col = p.gate_up_interleaved ? 2 * f : f, up_col = p.gate_up_interleaved ? 2 * f + 1 : inter + f;
        float gate_bias = 0.0f, up_bias = 0.0f;
        if (p.bias != nullptr) {
          gate_bias = load_float<B>(p.bias, long(expert) * p.N + gate_col);
          up_bias = load_float<B>(p.bias, long(expert) * p.N + up_col);
        }
#pragma unroll
        for (int i = 0; i < kBM / 8; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int token = m0 + 8 * i + 2 * c + e;
            if (token < p.M) {
              const float gate = to_float<O>(from_float<O>(acc[4 * i + e] + gate_bias));
              const float up = to_float<O>(from_float<O>(acc[4 * i + 2 + e] + up_bias));
              store_float<O>(p.out, long(token) * p.out_stride + f, gated<kAct>(gate, up, p.act_alpha, p.act_limit));
            }
          }
      } else {
        // The thread's two rows' biases are loaded once per tile and the pointers tested once, so that each
        // output costs a predicated multiply-add and its store, not a branch with a dependent load.
        if (past_n) continue;  // the thread's pipeline steps are all consumed: nothing left of this tile
        const bool scaled = p.x_scale != nullptr, biased = p.bias != nullptr;
        float bias_lo = 0.0f, bias_hi = 0.0f;
        if (biased) {
          bias_lo = load_float<B>(p.bias, long(expert) * p.N + n_base);
          bias_hi = load_float<B>(p.bias, long(expert) * p.N + n_base + 8);
        }
#pragma unroll
        for (int i = 0; i < kBM / 8; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int token = m0 + 8 * i + 2 * c + e;
            if (token < p.M) {
              float lo = acc[4 * i + e], hi = acc[4 * i + 2 + e];
              if (scaled) {
                const float s = p.x_scale[token * p.x_scale_stride];
                lo *= s;
                hi *= s;
              }
              if (biased) {
                lo += bias_lo;
                hi += bias_hi;
              }
              const long at = long(token) * p.out_stride + n_base;
              store_float<O>(p.out, at, lo);
              store_float<O>(p.out, at + 8, hi);
            }
          }
      }
    }
  }
}

}  // namespace gemm_sm90
}  // namespace humming
