// One block-scaled m16n8k64 MMA on registers given per lane (sm_120a): the hardware check of the PTX ISA
// fragment and scale tables that fp4_gemm_sm120.cuh and its emulation (tests/test_cuda_fp4.py) rely on.
// NOT YET RUN ON HARDWARE. Run by one warp: lane l reads regs[l] = {a0, a1, a2, a3, b0, b1, sfa, sfb} and
// writes d[l] = {c0, c1, c2, c3} of D = (A * scale_A) (B * scale_B).
#include "humming/fp4_gemm_sm120.cuh"

namespace humming {
namespace fp4_sm120 {

struct ProbeParams {
  const uint32_t* regs;  // [32][8]
  float* d;              // [32][4]
};

template <int kVec>
__device__ __forceinline__ void mma_probe(const ProbeParams& p) {
  const uint32_t* r = p.regs + 8 * threadIdx.x;
  const uint32_t a[4] = {r[0], r[1], r[2], r[3]};
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  mma_fp4<kVec>(d, a, r[4], r[5], r[6], r[7]);
#pragma unroll
  for (int e = 0; e < 4; ++e) p.d[4 * threadIdx.x + e] = d[e];
}

}  // namespace fp4_sm120
}  // namespace humming
