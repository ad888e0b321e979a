// FP8 W8A8 GEMM for Hopper (sm_90a): out[M, N] = (x[M, K] @ W[N, K]^T) * scales + bias, with e4m3
// weights and activations, fp32 accumulation on wgmma and 16-bit output.
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
//   stage on its 64 weight rows and releases the stage through its `empty` mbarrier (one arrive per warp).
//   setmaxnreg moves registers from the producer to the consumers;
// - promotion: each 128-wide K block is accumulated by wgmma in its own registers and then added, in
//   plain fp32, into the running total (tensor-core fp8 accumulation keeps fewer mantissa bits than fp32;
//   promoting once per 128 keeps the sum at fp32 accuracy). With kBlockScale the K block's partial sum is
//   multiplied by its scales there: weight block (128 x 128) times activation group (1 x 128) — the
//   DeepSeek-V3 recipe;
// - epilogue: total * w_scale[n] * x_scale[m] + bias[n] (per-channel or per-tensor weights, per-token or
//   per-tensor activations), rounded to bf16 / fp16, written transposed into shared memory with
//   stmatrix.trans (128-byte swizzled, conflict-free) and stored by TMA, which clips rows and columns
//   outside [M, N]. Loads past the edges of W and x are zero-filled by TMA, so any M, N and K work
//   (the host pads K to a multiple of 16 for the TMA stride rule).
#include "humming/common.cuh"
#include "humming/fp8_sm90_ptx.cuh"

namespace humming {
namespace fp8_sm90 {

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
  void* out;                   // [M, N] of dtype O, row stride out_stride elements (direct-store epilogue)
  int out_stride;
};
static_assert(sizeof(Params) == 512, "the host mirrors this layout (fp8_gemm.py, _Params)");

constexpr int kBK = 128;  // K per pipeline stage (bytes of e4m3 per tile row)

// Dynamic shared memory: [stages x (W tile, x tile)] [kWgs output slabs] [full, empty barriers], from a
// 1024-byte aligned base (the swizzle atom).
template <int kWgs, int kBlockM, int kStages>
struct SmemLayout {
  static constexpr int kBlockN = 64 * kWgs;
  static constexpr int kWBytes = kBlockN * kBK;
  static constexpr int kXBytes = kBlockM * kBK;
  static constexpr int kStageBytes = kWBytes + kXBytes;
  static constexpr int kOutSlab = kBlockM * 128;  // one warpgroup's [kBlockM tokens][64 channels] 16-bit
  static constexpr int kOut = kStages * kStageBytes;
  static constexpr int kBars = kOut + kWgs * kOutSlab;
  static constexpr int kBytes = 1024 + kBars + 16 * kStages;  // + worst-case base alignment
};

// kTmaStore: epilogue through shared memory (stmatrix) and a TMA store; else plain global stores.
template <int kWgs, int kBlockM, int kStages, bool kBlockScale, bool kTmaStore, DType O, DType B,
          int kProducerRegs, int kConsumerRegs>
__device__ __forceinline__ void run(const Params& p) {
  using L = SmemLayout<kWgs, kBlockM, kStages>;
  constexpr int kBlockN = L::kBlockN;
  constexpr int kAcc = kBlockM / 2;
  static_assert(kBlockM % 8 == 0 && kBlockM <= 128, "tokens per block: a multiple of 8, at most 128");
  static_assert(O == DType::bf16 || O == DType::f16, "16-bit output only");

  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t out_base = base + L::kOut;
  const uint32_t bar_base = base + L::kBars;
  auto w_tile = [&](int s) { return base + s * L::kStageBytes; };
  auto x_tile = [&](int s) { return base + s * L::kStageBytes + L::kWBytes; };
  auto full = [&](int s) { return bar_base + 8 * s; };
  auto empty = [&](int s) { return bar_base + 8 * (kStages + s); };

  // Grouped raster: group_m token tiles share each weight tile while it is in L2.
  const int per_group = p.group_m * p.tiles_n;
  const int group = blockIdx.x / per_group;
  const int first_m = group * p.group_m;
  const int group_rows = min(p.tiles_m - first_m, p.group_m);
  const int in_group = blockIdx.x % per_group;
  const int m_tile = first_m + in_group % group_rows;
  const int n_tile = in_group / group_rows;

  const int wg = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full(s), 1);
      mbar_init(empty(s), 4 * kWgs);
    }
    fence_mbar_init();
  }
  __syncthreads();

  if (wg == kWgs) {
    setmaxnreg_dec<kProducerRegs>();
    if (tid == 0) {
      prefetch_tensor_map(&p.w_map);
      prefetch_tensor_map(&p.x_map);
      for (int kb = 0; kb < p.num_kb; ++kb) {
        const int s = kb % kStages;
        if (kb >= kStages) mbar_wait(empty(s), ((kb / kStages) - 1) & 1);
        mbar_expect_tx(full(s), L::kStageBytes);
        tma_load_2d(w_tile(s), &p.w_map, full(s), kb * kBK, n_tile * kBlockN);
        tma_load_2d(x_tile(s), &p.x_map, full(s), kb * kBK, m_tile * kBlockM);
      }
    }
  } else {
    setmaxnreg_inc<kConsumerRegs>();
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int col = 2 * (lane % 4);  // this thread's first token column in each group of 8
    float acc[kAcc];
    float total[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) total[i] = 0.0f;

    for (int kb = 0; kb < p.num_kb; ++kb) {
      const int s = kb % kStages;
      float w_block = 1.0f;
      float2 x_block[kBlockM / 8];
      if constexpr (kBlockScale) {  // issued before the wait: the loads overlap the wgmmas
        w_block = __ldg(p.w_block_scale + (n_tile * kBlockN / 128) * p.num_kb + kb);
        const float* xs = p.x_block_scale + long(kb) * p.x_block_stride + m_tile * kBlockM + col;
#pragma unroll
        for (int j = 0; j < kBlockM / 8; ++j) x_block[j] = __ldg(reinterpret_cast<const float2*>(xs + 8 * j));
      }
      mbar_wait(full(s), (kb / kStages) & 1);
      const uint64_t a_desc = sw128_desc(w_tile(s) + wg * 64 * kBK);
      const uint64_t b_desc = sw128_desc(x_tile(s));
      fence_registers(acc);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kBK / 32; ++k) Wgmma<kBlockM>::mma(acc, a_desc + 2 * k, b_desc + 2 * k, k);
      wgmma_commit();
      wgmma_wait_all();
      fence_registers(acc);
      if (lane == 0) mbar_arrive(empty(s));
#pragma unroll
      for (int j = 0; j < kBlockM / 8; ++j) {
        if constexpr (kBlockScale) {
          const float s0 = w_block * x_block[j].x;
          const float s1 = w_block * x_block[j].y;
          total[4 * j + 0] = fmaf(acc[4 * j + 0], s0, total[4 * j + 0]);
          total[4 * j + 1] = fmaf(acc[4 * j + 1], s1, total[4 * j + 1]);
          total[4 * j + 2] = fmaf(acc[4 * j + 2], s0, total[4 * j + 2]);
          total[4 * j + 3] = fmaf(acc[4 * j + 3], s1, total[4 * j + 3]);
        } else {
#pragma unroll
          for (int c = 0; c < 4; ++c) total[4 * j + c] += acc[4 * j + c];
        }
      }
    }

    // Epilogue: this thread holds channels `row` and `row + 8` of its warp's 16, tokens 8 j + col + {0, 1}.
    const int row = 16 * warp + lane / 4;
    const int n = n_tile * kBlockN + 64 * wg + row;
    float ws0 = 1.0f, ws1 = 1.0f, b0 = 0.0f, b1 = 0.0f;
    if constexpr (!kBlockScale) {
      ws0 = p.w_scale[n];
      ws1 = p.w_scale[n + 8];
    }
    if (p.bias != nullptr) {
      b0 = load_float<B>(p.bias, min(n, p.N - 1));
      b1 = load_float<B>(p.bias, min(n + 8, p.N - 1));
    }
    const uint32_t slab = out_base + wg * L::kOutSlab;
    const int token_row = lane % 8;         // stmatrix row address of this lane (lanes 0-15)
    const int chunk = 2 * warp + (lane / 8) % 2;  // its 16-byte chunk (8 channels) in the 128-byte row
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
        const long row0 = long(t) * p.out_stride, row1 = row0 + p.out_stride;
        if (t < p.M && n < p.N) store_float<O>(p.out, row0 + n, v00);
        if (t + 1 < p.M && n < p.N) store_float<O>(p.out, row1 + n, v01);
        if (t < p.M && n + 8 < p.N) store_float<O>(p.out, row0 + n + 8, v10);
        if (t + 1 < p.M && n + 8 < p.N) store_float<O>(p.out, row1 + n + 8, v11);
      }
    }
    if constexpr (kTmaStore) {
      fence_proxy_async();
      named_barrier_sync(1 + wg, 128);
      if (tid == 0) {
        tma_store_2d(&p.out_map, slab, n_tile * kBlockN + 64 * wg, m_tile * kBlockM);
        tma_store_commit_and_wait();
      }
    }
  }
}

}  // namespace fp8_sm90
}  // namespace humming
