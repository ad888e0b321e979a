// Block-scaled FP4 GEMM for datacenter Blackwell (sm_100a: B200, GB200) on tcgen05 (UMMA, tensor memory):
// out[M, N] = (x[M, K] @ W[N, K]^T) * x_global * w_global + bias, with x and W both e2m1 (W4A4).
//
// NOT YET RUN ON HARDWARE: compiled for sm_100a in CI; tests/test_cuda_fp4.py mirrors every layout, offset
// and descriptor of this file in torch and checks that they reproduce humming.dequantize-based matmul.
//
// - Formats: NVFP4 (kVec 16: ue4m3 scale per 16 along K, fp32 global scales in the epilogue) through
//   tcgen05.mma kind::mxf4nvf4 scale_vec::4X, MXFP4 (kVec 32: ue8m0 per 32) through kind::mxf4 2X.
// - Operands: the weights are the MMA A operand (M = 128 channels per block), the tokens the B operand
//   (N = kBlockT tokens), so a decode-sized M still fills the 128-row MMA. D[channel, token] lives in tensor
//   memory (lane = channel, column = token). Both operands are row-major [rows, Kp / 2] bytes (element 2i in
//   the low nibble of byte i), loaded by TMA in boxes of 128 bytes (256 elements) x rows with the 128-byte
//   swizzle: the canonical K-major SWIZZLE_128B layout (8-row, 1024-byte atoms) the shared-memory
//   descriptors describe (stride byte offset 1024; each k64 MMA step advances the start address by 32 bytes).
// - Scale factors: the host stores them in 512-byte atoms (fp4_gemm.sf_atoms): 128 rows x 4 scale bytes,
//   row 32 j + i at byte 16 i + 4 j. Each atom is bulk-copied to shared memory, then tcgen05.cp 32x128b.warpx4
//   puts row i of the atom (16 bytes) into tensor-memory lane i (of every 32-lane quarter), columns c..c+3,
//   so the scales of matrix row r are in lane r % 32, column c + r / 32: the layout the block-scaled MMA
//   reads. An atom covers 64 of K for NVFP4 (one MMA, scale-factor id 0) and 128 for MXFP4 (two MMAs,
//   ids 0 and 2: the byte where the MMA's two scales start).
// - Descriptors: the constant fields of the shared-memory descriptors and the instruction descriptor are
//   built on the host (fp4_gemm.py: AB_DESC, SF_DESC, instr_desc) and passed in Params; the kernel adds the
//   start address (bits 0-13, address >> 4) and the scale-factor ids (bits 4-5 B, 29-30 A).
// - Warps: warp 0 issues TMA (one lane), warp 1 owns tensor memory and issues tcgen05.cp / tcgen05.mma /
//   tcgen05.commit (one lane), warps 2-5 are the epilogue warpgroup: warp w reads tensor-memory lanes
//   32 (w % 4) .. + 31 with tcgen05.ld 32x32b (one channel per thread, 16 tokens per load).
// - Pipeline: kStages shared-memory stages of kBK = 256 along K; full[s] completes on TMA bytes, empty[s] on
//   tcgen05.commit after the stage's four MMAs; each stage has its own tensor-memory scale columns, so a
//   tcgen05.cp never overwrites scales that an MMA in flight still reads. The last commit signals acc_full.
// - Bounds: TMA zero-fills rows past M / N; the host pads K to a multiple of kBK with zero codes and the scale
//   atoms with finite scales; the epilogue stores only rows < M and channels < N.
#include "humming/common.cuh"
#include "humming/sm90_ptx.cuh"
#include "humming/sm100_ptx.cuh"

namespace humming {
namespace fp4_sm100 {

using sm90::TensorMap;

struct Params {
  TensorMap w_map;         // e2m1 weights uint8 [N, Kp / 2], box {128, 128}, 128-byte swizzle
  TensorMap x_map;         // e2m1 tokens uint8 [M, Kp / 2], box {128, kBlockT}, 128-byte swizzle
  const uint8_t* w_sf;     // weight scale atoms [cdiv(N, 128), Kp / (4 kVec), 512]
  const uint8_t* x_sf;     // token scale atoms [cdiv(M, kBlockT) * kTokenAtoms, Kp / (4 kVec), 512]
  const float* x_global;   // [1] fp32 second-level scale of x, or null (= 1)
  const float* w_global;   // [1] fp32 second-level scale of W, or null (= 1)
  const void* bias;        // [N] of dtype B, or null
  void* out;               // [M, N] of dtype O, row stride out_stride elements
  uint64_t ab_desc;        // A / B shared-memory descriptor without its start address
  uint64_t sf_desc;        // tcgen05.cp source descriptor without its start address
  uint32_t idesc;          // instruction descriptor with scale-factor ids 0
  int M, N, Kp;            // Kp: a multiple of kBK
  int out_stride;
};
static_assert(sizeof(Params) == 384, "the host mirrors this layout (fp4_gemm.py, _Sm100Params)");

constexpr int kBK = 256;            // K elements per pipeline stage
constexpr int kRowBytes = kBK / 2;  // bytes of one tile row per stage: one 128-byte swizzle row
constexpr int kBlockN = 128;        // channels per block: the MMA's M
constexpr int kAtomBytes = 512;     // one scale atom: 128 rows x 4 bytes
constexpr int kThreads = 192;       // TMA warp, MMA warp, 4 epilogue warps

template <int kVec, int kBlockT, int kStages>
struct Layout {
  static constexpr int kAtomsK = kBK / (4 * kVec);              // scale atoms along K per stage (4 or 2)
  static constexpr int kTokenAtoms = (kBlockT + 127) / 128;     // scale atoms along the tokens (1 or 2)
  static constexpr int kABytes = kBlockN * kRowBytes;           // 16 KiB
  static constexpr int kBBytes = kBlockT * kRowBytes;
  static constexpr int kSfRowBytes = kAtomsK * kAtomBytes;     // one 128-row atom row of a stage
  static constexpr int kSfaBytes = kSfRowBytes;
  static constexpr int kSfbBytes = kTokenAtoms * kSfRowBytes;
  static constexpr int kStageBytes = kABytes + kBBytes + kSfaBytes + kSfbBytes;
  // Shared memory, from a 1024-byte aligned base: [stage][A], [stage][B], [stage][SFA], [stage][SFB],
  // full[stage], empty[stage], acc_full (8 bytes each), the tensor-memory base address.
  static constexpr int kA = 0;
  static constexpr int kB = kA + kStages * kABytes;
  static constexpr int kSfa = kB + kStages * kBBytes;
  static constexpr int kSfb = kSfa + kStages * kSfaBytes;
  static constexpr int kBars = kSfb + kStages * kSfbBytes;
  static constexpr int kTmemSlot = kBars + 8 * (2 * kStages + 1);
  static constexpr int kSmemBytes = kTmemSlot + 4 + 1024;  // + alignment slack of the dynamic base
  // Tensor-memory columns: the fp32 accumulator [128 lanes, kBlockT], then per stage the SFA columns (4 per
  // atom), then per stage the SFB columns (4 per atom and token atom, token atoms adjacent).
  static constexpr int kSfaCol = kBlockT;
  static constexpr int kSfbCol = kSfaCol + kStages * kAtomsK * 4;
  static constexpr int kTmemCols = kSfbCol + kStages * kAtomsK * kTokenAtoms * 4;
  static constexpr int kTmemAlloc = kTmemCols <= 256 ? 256 : 512;
  // The M = 128 MMA takes N = 16..256 in steps of 16 (CUTLASS allows steps of 8 for kind::mxf4*); the
  // epilogue reads 16 columns at a time.
  static_assert(kBlockT % 16 == 0 && kBlockT <= 256, "token blocks of 16..256, multiples of 16");
  static_assert(kBlockT < 128 || kBlockT % 128 == 0, "token blocks fill whole scale atoms or part of one");
  static_assert(kTmemCols <= 512, "tensor memory has 512 columns");
  static_assert(kSmemBytes <= 232448, "sm_100 allows 227 KiB of shared memory per block");
};

template <int kVec, int kBlockT, int kStages, DType O, DType B>
__device__ __forceinline__ void run(const Params& p) {
  using L = Layout<kVec, kBlockT, kStages>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023) & ~1023u;
  const uint32_t full = base + L::kBars, empty = full + 8 * kStages, acc_full = empty + 8 * kStages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = blockIdx.x * kBlockN, t_block = blockIdx.y;
  const int num_kb = p.Kp / kBK, atoms_k = p.Kp / (4 * kVec);

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(full + 8 * s, 1);
      sm90::mbar_init(empty + 8 * s, 1);
    }
    sm90::mbar_init(acc_full, 1);
    sm90::fence_mbar_init();
    sm90::prefetch_tensor_map(&p.w_map);
    sm90::prefetch_tensor_map(&p.x_map);
  }
  if (warp == 1) sm100::tmem_alloc<L::kTmemAlloc>(base + L::kTmemSlot);
  sm100::fence_before_sync();
  __syncthreads();
  sm100::fence_after_sync();
  uint8_t* const smem = smem_raw + (base - smem_addr(smem_raw));  // generic pointer to `base`
  const uint32_t tmem = *reinterpret_cast<volatile uint32_t*>(smem + L::kTmemSlot);

  if (warp == 0 && lane == 0) {
    for (int kb = 0; kb < num_kb; ++kb) {
      const int s = kb % kStages;
      sm90::mbar_wait(empty + 8 * s, ((kb / kStages) & 1) ^ 1);
      const uint32_t bar = full + 8 * s;
      sm90::mbar_expect_tx(bar, L::kStageBytes);
      sm90::tma_load_2d(base + L::kA + s * L::kABytes, &p.w_map, bar, kb * kRowBytes, n0);
      sm90::tma_load_2d(base + L::kB + s * L::kBBytes, &p.x_map, bar, kb * kRowBytes, t_block * kBlockT);
      const long k_atom = long(kb) * L::kAtomsK;
      sm90::bulk_load(base + L::kSfa + s * L::kSfaBytes,
                          p.w_sf + (long(blockIdx.x) * atoms_k + k_atom) * kAtomBytes, L::kSfaBytes, bar);
#pragma unroll
      for (int a = 0; a < L::kTokenAtoms; ++a) {
        const long row_atom = long(t_block) * L::kTokenAtoms + a;
        sm90::bulk_load(base + L::kSfb + s * L::kSfbBytes + a * L::kSfRowBytes,
                            p.x_sf + (row_atom * atoms_k + k_atom) * kAtomBytes, L::kSfRowBytes, bar);
      }
    }
  } else if (warp == 1 && lane == 0) {
    for (int kb = 0; kb < num_kb; ++kb) {
      const int s = kb % kStages;
      sm90::mbar_wait(full + 8 * s, (kb / kStages) & 1);
      sm100::fence_after_sync();
#pragma unroll
      for (int ja = 0; ja < L::kAtomsK; ++ja) {
        const uint32_t sfa_col = L::kSfaCol + (s * L::kAtomsK + ja) * 4;
        sm100::cp_32x128b_warpx4(tmem + sfa_col,
                                 p.sf_desc | ((base + L::kSfa + s * L::kSfaBytes + ja * kAtomBytes) >> 4));
#pragma unroll
        for (int a = 0; a < L::kTokenAtoms; ++a) {
          const uint32_t sfb_col = L::kSfbCol + ((s * L::kAtomsK + ja) * L::kTokenAtoms + a) * 4;
          const uint32_t src = base + L::kSfb + s * L::kSfbBytes + a * L::kSfRowBytes + ja * kAtomBytes;
          sm100::cp_32x128b_warpx4(tmem + sfb_col, p.sf_desc | (src >> 4));
        }
      }
#pragma unroll
      for (int j = 0; j < kBK / 64; ++j) {
        const int ja = j * 64 / (4 * kVec);                    // the atom holding this k64 step's scales
        const uint32_t sf_id = (j * 64 % (4 * kVec)) / kVec;  // the byte its scales start at
        const uint32_t idesc = p.idesc | (sf_id << 29) | (sf_id << 4);
        const uint64_t a_desc = p.ab_desc | ((base + L::kA + s * L::kABytes + 32 * j) >> 4);
        const uint64_t b_desc = p.ab_desc | ((base + L::kB + s * L::kBBytes + 32 * j) >> 4);
        const uint32_t sfa = tmem + L::kSfaCol + (s * L::kAtomsK + ja) * 4;
        const uint32_t sfb = tmem + L::kSfbCol + (s * L::kAtomsK + ja) * L::kTokenAtoms * 4;
        sm100::mma_block_scaled<kVec>(tmem, a_desc, b_desc, idesc, sfa, sfb, (kb | j) != 0);
      }
      sm100::commit(empty + 8 * s);  // the stage's shared memory is free once these MMAs completed
    }
    sm100::commit(acc_full);
  } else if (warp >= 2) {
    const int quarter = warp % 4;
    const int n = n0 + 32 * quarter + lane;
    sm90::mbar_wait(acc_full, 0);
    __syncwarp();  // the lanes leave the wait loop apart; tcgen05.ld is .aligned
    sm100::fence_after_sync();
    const float global = (p.x_global ? *p.x_global : 1.0f) * (p.w_global ? *p.w_global : 1.0f);
    const float bias = (p.bias && n < p.N) ? load_float<B>(p.bias, n) : 0.0f;
#pragma unroll 1
    for (int c = 0; c < kBlockT; c += 16) {
      uint32_t r[16];
      sm100::ld_32x32b_x16(tmem + (uint32_t(32 * quarter) << 16) + c, r);
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int t = t_block * kBlockT + c + i;
        const float v = __uint_as_float(r[i]) * global + bias;
        if (t < p.M && n < p.N) store_float<O>(p.out, long(t) * p.out_stride + n, v);
      }
    }
  }
  sm100::fence_before_sync();
  __syncthreads();
  if (warp == 1) {
    __syncwarp();  // lane 0 issued the MMAs alone; tcgen05.dealloc is .aligned
    sm100::fence_after_sync();
    sm100::tmem_dealloc<L::kTmemAlloc>(tmem);
  }
}

}  // namespace fp4_sm100
}  // namespace humming
