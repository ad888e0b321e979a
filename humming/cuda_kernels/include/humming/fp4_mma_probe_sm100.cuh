// One block-scaled tcgen05 UMMA (sm_100a), M = 128, N = 32, K = 64: the hardware check of what
// fp4_gemm_sm100.cuh and its emulation (tests/test_cuda_fp4_sm100.py) rely on (the 128-byte swizzled K-major
// operand layout, the host-built descriptors, the scale atoms in tensor memory, the scale-factor id), apart
// from the GEMM's pipeline. NOT YET RUN ON HARDWARE. One CTA of 128 threads:
// - A (128 rows) and B (32 rows) of 32 bytes each are written to shared memory as TMA would write the first
//   32 bytes of 128-byte swizzled rows (byte b of row r at sw128(128 r + b)); the scale atoms (512 bytes
//   each, fp4_gemm.sf_atoms layout) verbatim;
// - tcgen05.cp 32x128b.warpx4 of both atoms, one tcgen05.mma with scale-factor id `sf_id`, commit;
// - thread i of warp w writes d[32 w + i][0..31] = D row 32 w + i (tcgen05.ld 32x32b).
#include "humming/fp4_gemm_sm100.cuh"

namespace humming {
namespace fp4_sm100 {

struct ProbeParams {
  const uint8_t* a;    // [128][32] e2m1 codes, two per byte
  const uint8_t* b;    // [32][32]
  const uint8_t* sfa;  // [512] one scale atom
  const uint8_t* sfb;  // [512]
  float* d;            // [128][32]
  uint64_t ab_desc;    // fp4_gemm.AB_DESC
  uint64_t sf_desc;    // fp4_gemm.SF_DESC
  uint32_t idesc;      // fp4_gemm.instr_desc(kVec, 32)
  uint32_t sf_id;      // 0, or 2 for the second k64 step of an MXFP4 atom
};

constexpr int kProbeN = 32;

template <int kVec>
__device__ __forceinline__ void mma_probe(const ProbeParams& p) {
  __shared__ __align__(1024) uint8_t s_a[128 * 128];
  __shared__ __align__(1024) uint8_t s_b[kProbeN * 128];
  __shared__ __align__(16) uint8_t s_sf[2 * kAtomBytes];
  __shared__ __align__(8) uint64_t bar;
  __shared__ uint32_t tmem_slot;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto sw128 = [](int off) { return off ^ (((off >> 7) & 7) << 4); };
  for (int i = threadIdx.x; i < (128 + kProbeN) * 32; i += 128) {
    const int row = i / 32, byte = i % 32;
    if (row < 128) {
      s_a[sw128(128 * row + byte)] = p.a[i];
    } else {
      s_b[sw128(128 * (row - 128) + byte)] = p.b[i - 128 * 32];
    }
  }
  for (int i = threadIdx.x; i < kAtomBytes; i += 128) {
    s_sf[i] = p.sfa[i];
    s_sf[kAtomBytes + i] = p.sfb[i];
  }
  const uint32_t bar_addr = smem_addr(&bar);
  if (threadIdx.x == 0) {
    sm90::mbar_init(bar_addr, 1);
    sm90::fence_mbar_init();
  }
  sm90::fence_proxy_async();  // the generic-proxy writes above, before the tensor core reads them
  if (warp == 0) sm100::tmem_alloc<256>(smem_addr(&tmem_slot));
  sm100::fence_before_sync();
  __syncthreads();
  sm100::fence_after_sync();
  const uint32_t tmem = *reinterpret_cast<volatile uint32_t*>(&tmem_slot);
  if (threadIdx.x == 0) {
    const uint32_t sfa = tmem + 128, sfb = tmem + 132, sf = smem_addr(s_sf);
    sm100::cp_32x128b_warpx4(sfa, p.sf_desc | (sf >> 4));
    sm100::cp_32x128b_warpx4(sfb, p.sf_desc | ((sf + kAtomBytes) >> 4));
    const uint32_t idesc = p.idesc | (p.sf_id << 29) | (p.sf_id << 4);
    sm100::mma_block_scaled<kVec>(tmem, p.ab_desc | (smem_addr(s_a) >> 4),
                                  p.ab_desc | (smem_addr(s_b) >> 4), idesc, sfa, sfb, 0);
    sm100::commit(bar_addr);
  }
  sm90::mbar_wait(bar_addr, 0);
  __syncwarp();
  sm100::fence_after_sync();
#pragma unroll
  for (int c = 0; c < kProbeN; c += 16) {
    uint32_t r[16];
    sm100::ld_32x32b_x16(tmem + (uint32_t(32 * warp) << 16) + c, r);
#pragma unroll
    for (int i = 0; i < 16; ++i) p.d[(32 * warp + lane) * kProbeN + c + i] = __uint_as_float(r[i]);
  }
  sm100::fence_before_sync();
  __syncthreads();
  if (warp == 0) {
    sm100::fence_after_sync();
    sm100::tmem_dealloc<256>(tmem);
  }
}

}  // namespace fp4_sm100
}  // namespace humming
