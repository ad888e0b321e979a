// Block-scaled FP4 GEMM for consumer Blackwell (sm_120a: RTX 50xx, RTX PRO 6000):
// out[M, N] = (x[M, K] @ W[N, K]^T) * x_global * w_global + bias, with x and W both e2m1 (W4A4).
//
// NOT YET RUN ON HARDWARE: compiled for sm_120a in CI; its data movement is mirrored in Python by
// tests/test_cuda_fp4.py (the emulation there reproduces humming.dequantize-based matmul).
//
// - Formats: NVFP4 (kVec = 16: one ue4m3 scale per 16 elements along K, fp32 global scales applied in the
//   epilogue) through mma.sync m16n8k64 kind::mxf4nvf4 scale_vec::4X, and MXFP4 (kVec = 32: one ue8m0
//   scale per 32) through kind::mxf4 scale_vec::2X. The tensor core applies the block scales itself.
// - Operands: tokens are the MMA A operand (16 rows), weights the B operand (8 columns); both are
//   row-major [rows, Kp/2] bytes, element 2i in the low nibble of byte i (humming's canonical packing),
//   which is the nibble order the MMA reads from each 32-bit register.
// - Tiling: a block computes kBlockM tokens x kBlockN channels with kWarpsM x kWarpsN warps, each warp
//   kMTiles m16 tiles x kNTiles n8 tiles. K runs in stages of kBK = 128 (64 bytes per row), two m16n8k64
//   steps each, through a kStages-deep cp.async ring. Tiles are stored with their four 16-byte chunks
//   XOR-swizzled by bits 1-2 of the row (tile_offset), so that each 8-row ldmatrix phase is conflict-free.
// - Fragments (PTX ISA, "Matrix fragments for mma.m16n8k64", 4-bit types; g = lane / 4, t = lane % 4):
//   a0 = A[g][8t .. 8t+7], a1 = A[g+8][same], a2 = A[g][32+8t ..], a3 = A[g+8][32+8t ..];
//   b0 = B[8t .. 8t+7][g], b1 = B[32+8t ..][g]; c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1].
//   One ldmatrix.x4 gives a0..a3 of an m16 tile, or b0, b1 of two n8 tiles.
// - Scales (PTX ISA, "Block Scaling for mma.sync", selectors {byte-id, thread-id} = {0, 0}): the A scales
//   of row r come from lane 4 (r % 8) + r / 8, the B scales of column n from lane 4 n; the register holds
//   the scales of the 64-wide K step in byte order (4 ue4m3 bytes for 4X, 2 ue8m0 bytes for 2X). Every
//   lane loads the scales of row g + 8 (lane % 2) / column g (the lanes not read by the MMA load harmless
//   duplicates).
// - Rows past M or N are zero-filled by cp.async; the host pads K to a multiple of kBK with zero codes.
#include "humming/common.cuh"

namespace humming {
namespace fp4_sm120 {

struct Params {
  const uint8_t* x;        // [M, Kp / 2] e2m1 codes, two per byte
  const uint8_t* w;        // [N, Kp / 2]
  const uint8_t* x_scale;  // [M, Kp / kVec] ue4m3 (kVec 16) or ue8m0 (kVec 32)
  const uint8_t* w_scale;  // [N, Kp / kVec]
  const float* x_global;   // [1] fp32 second-level scale of x, or null (= 1)
  const float* w_global;   // [1] fp32 second-level scale of W, or null (= 1)
  const void* bias;        // [N] of dtype B, or null
  void* out;               // [M, N] of dtype O, row stride out_stride elements
  int M, N, Kp;            // Kp: a multiple of kBK
  int out_stride;
};
static_assert(sizeof(Params) == 80, "the host mirrors this layout (fp4_gemm.py, _Params)");

constexpr int kBK = 128;         // K elements per pipeline stage
constexpr int kRowBytes = kBK / 2;  // bytes of one tile row per stage

// Byte offset of 16-byte chunk `chunk` (0..3) of tile row `row`: chunks XOR-swizzled by bits 1-2 of the
// row, so the 8 rows of one ldmatrix phase land in 8 distinct 4-bank groups.
__device__ __forceinline__ int tile_offset(int row, int chunk) {
  return row * kRowBytes + ((chunk ^ ((row >> 1) & 3)) << 4);
}

// D += (A * scale_A) (B * scale_B), m16n8k64, e2m1 x e2m1, fp32 accumulators.
template <int kVec>
__device__ __forceinline__ void mma_fp4(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                        uint32_t sfa, uint32_t sfb) {
  if constexpr (kVec == 16) {
    asm("mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3}, %10, {0, 0}, %11, {0, 0};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(sfa), "r"(sfb));
  } else {
    static_assert(kVec == 32, "NVFP4 (16) or MXFP4 (32) scale blocks");
    asm("mma.sync.aligned.m16n8k64.row.col.kind::mxf4.block_scale.scale_vec::2X.f32.e2m1.e2m1.f32.ue8m0 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3}, %10, {0, 0}, %11, {0, 0};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(sfa), "r"(sfb));
  }
}

// The scale bytes of one 64-wide K step (4 for kVec 16, 2 for kVec 32) of a row, from shared memory.
template <int kVec>
__device__ __forceinline__ uint32_t load_scales(const uint8_t* row_scales, int ks) {
  if constexpr (kVec == 16) {
    return *reinterpret_cast<const uint32_t*>(row_scales + 4 * ks);
  } else {
    return *reinterpret_cast<const uint16_t*>(row_scales + 2 * ks);
  }
}

template <int kVec, int kWarpsM, int kWarpsN, int kMTiles, int kNTiles, int kStages, DType O, DType B>
__device__ __forceinline__ void run(const Params& p) {
  static_assert(kNTiles % 2 == 0, "one ldmatrix.x4 loads two n8 tiles");
  constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  constexpr int kBlockM = 16 * kMTiles * kWarpsM;
  constexpr int kBlockN = 8 * kNTiles * kWarpsN;
  constexpr int kSfBytes = kBK / kVec;  // scale bytes per tile row per stage

  __shared__ __align__(128) uint8_t s_x[kStages][kBlockM * kRowBytes];
  __shared__ __align__(128) uint8_t s_w[kStages][kBlockN * kRowBytes];
  __shared__ __align__(16) uint8_t s_xs[kStages][kBlockM * kSfBytes];
  __shared__ __align__(16) uint8_t s_ws[kStages][kBlockN * kSfBytes];

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
  const int m0 = blockIdx.y * kBlockM, n0 = blockIdx.x * kBlockN;
  const long row_bytes = p.Kp / 2, row_sf = p.Kp / kVec;
  const int num_kb = p.Kp / kBK;

  auto load_stage = [&](int stage, int kb) {
    for (int c = threadIdx.x; c < (kBlockM + kBlockN) * 4; c += kThreads) {
      const bool is_x = c < kBlockM * 4;
      const int row = (is_x ? c : c - kBlockM * 4) / 4, chunk = c % 4;
      const int g = (is_x ? m0 : n0) + row;
      const bool valid = g < (is_x ? p.M : p.N);
      const uint8_t* src = (is_x ? p.x : p.w) + (valid ? g : 0) * row_bytes + kb * kRowBytes + chunk * 16;
      uint8_t* dst = (is_x ? s_x[stage] : s_w[stage]) + tile_offset(row, chunk);
      cp_async_ca_zfill<16>(smem_addr(dst), src, valid);
    }
    for (int r = threadIdx.x; r < kBlockM + kBlockN; r += kThreads) {
      const bool is_x = r < kBlockM;
      const int row = is_x ? r : r - kBlockM;
      const int g = (is_x ? m0 : n0) + row;
      const bool valid = g < (is_x ? p.M : p.N);
      const uint8_t* src = (is_x ? p.x_scale : p.w_scale) + (valid ? g : 0) * row_sf + kb * kSfBytes;
      uint8_t* dst = (is_x ? s_xs[stage] : s_ws[stage]) + row * kSfBytes;
      cp_async_ca_zfill<kSfBytes>(smem_addr(dst), src, valid);
    }
  };

  float acc[kMTiles][kNTiles][4];
#pragma unroll
  for (int i = 0; i < kMTiles; ++i)
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_kb) load_stage(s, s);
    cp_async_commit();
  }

  const int a_row0 = warp_m * kMTiles * 16, b_row0 = warp_n * kNTiles * 8;
  for (int kb = 0; kb < num_kb; ++kb) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kb landed for every thread, and stage kb - 1 is free to refill
    const int next = kb + kStages - 1;
    if (next < num_kb) load_stage(next % kStages, next);
    cp_async_commit();

    const int stage = kb % kStages;
#pragma unroll
    for (int ks = 0; ks < kBK / 64; ++ks) {
      uint32_t a[kMTiles][4], sfa[kMTiles];
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
        const int row = a_row0 + 16 * i + (lane % 8) + 8 * ((lane / 8) % 2);
        ldmatrix_x4(s_x[stage] + tile_offset(row, 2 * ks + lane / 16), a[i][0], a[i][1], a[i][2], a[i][3]);
        const int sf_row = a_row0 + 16 * i + lane / 4 + 8 * (lane % 2);
        sfa[i] = load_scales<kVec>(s_xs[stage] + sf_row * kSfBytes, ks);
      }
      uint32_t b[kNTiles][2], sfb[kNTiles];
#pragma unroll
      for (int j = 0; j < kNTiles; j += 2) {
        const int row = b_row0 + 8 * j + (lane % 8) + 8 * (lane / 16);
        ldmatrix_x4(s_w[stage] + tile_offset(row, 2 * ks + (lane / 8) % 2), b[j][0], b[j][1], b[j + 1][0],
                    b[j + 1][1]);
      }
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) sfb[j] = load_scales<kVec>(s_ws[stage] + (b_row0 + 8 * j + lane / 4) * kSfBytes, ks);
#pragma unroll
      for (int i = 0; i < kMTiles; ++i)
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) mma_fp4<kVec>(acc[i][j], a[i], b[j][0], b[j][1], sfa[i], sfb[j]);
    }
  }

  const float global = (p.x_global ? *p.x_global : 1.0f) * (p.w_global ? *p.w_global : 1.0f);
#pragma unroll
  for (int i = 0; i < kMTiles; ++i)
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = m0 + a_row0 + 16 * i + lane / 4 + 8 * (e / 2);
        const int n = n0 + b_row0 + 8 * j + 2 * (lane % 4) + e % 2;
        if (m < p.M && n < p.N) {
          float v = acc[i][j][e] * global;
          if (p.bias) v += load_float<B>(p.bias, n);
          store_float<O>(p.out, long(m) * p.out_stride + n, v);
        }
      }
}

}  // namespace fp4_sm120
}  // namespace humming
