// PTX wrappers for the tcgen05 (5th-generation tensor core) instructions of sm_100a: tensor-memory
// allocation, shared -> tensor memory copies, block-scaled UMMA, commit to an mbarrier, tensor-memory loads.
// Tensor-memory addresses are 32 bits: lane in bits 16-31, 32-bit column in bits 0-15.
#include "humming/types.cuh"

namespace humming {
namespace sm100 {

// Allocates `kCols` columns (a power of two, 32..512) of tensor memory for the CTA and writes the base
// address to shared memory at `dst`. Executed by one whole warp.
template <int kCols>
__device__ __forceinline__ void tmem_alloc(uint32_t dst) {
  static_assert(kCols >= 32 && kCols <= 512 && (kCols & (kCols - 1)) == 0, "a power of two in 32..512");
  asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;" ::"r"(dst), "n"(kCols)
               : "memory");
  asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;" ::: "memory");
}

template <int kCols>
__device__ __forceinline__ void tmem_dealloc(uint32_t base) {
  asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;" ::"r"(base), "n"(kCols) : "memory");
}

// Orders tcgen05 operations after / before the thread synchronisation (mbarrier wait, bar.sync) around them.
__device__ __forceinline__ void fence_after_sync() {
  asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory");
}
__device__ __forceinline__ void fence_before_sync() {
  asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory");
}

// 32 rows x 16 bytes of shared memory (described by `src_desc`) into tensor-memory lanes 0-31, columns
// dst..dst+3, repeated in each of the four 32-lane quarters (lanes 32q..32q+31).
__device__ __forceinline__ void cp_32x128b_warpx4(uint32_t dst, uint64_t src_desc) {
  asm volatile("tcgen05.cp.cta_group::1.32x128b.warpx4 [%0], %1;" ::"r"(dst), "l"(src_desc) : "memory");
}

// D[128, N] (+)= (A * SFA) (B * SFB)^T over K = 64, e2m1 operands described by shared-memory descriptors,
// fp32 D in tensor memory; scale factors in tensor memory at sfa / sfb. kVec 16: kind::mxf4nvf4 4X (NVFP4,
// ue4m3 per 16); kVec 32: kind::mxf4 2X (MXFP4, ue8m0 per 32). `accumulate` = 0 overwrites D.
template <int kVec>
__device__ __forceinline__ void mma_block_scaled(uint32_t d, uint64_t a_desc, uint64_t b_desc, uint32_t idesc,
                                                 uint32_t sfa, uint32_t sfb, uint32_t accumulate) {
  if constexpr (kVec == 16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %4, 0;\n"
        "tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X [%0], %1, %2, %3, [%5], [%6], p;\n}\n" ::"r"(
            d),
        "l"(a_desc), "l"(b_desc), "r"(idesc), "r"(accumulate), "r"(sfa), "r"(sfb)
        : "memory");
  } else {
    static_assert(kVec == 32, "NVFP4 (16) or MXFP4 (32) scale blocks");
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %4, 0;\n"
        "tcgen05.mma.cta_group::1.kind::mxf4.block_scale.scale_vec::2X [%0], %1, %2, %3, [%5], [%6], p;\n}\n" ::"r"(d),
        "l"(a_desc), "l"(b_desc), "r"(idesc), "r"(accumulate), "r"(sfa), "r"(sfb)
        : "memory");
  }
}

// Arrives once on the mbarrier at `bar` when every tcgen05 operation this thread issued before has completed.
__device__ __forceinline__ void commit(uint32_t bar) {
  asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];" ::"r"(bar) : "memory");
}

// 16 consecutive 32-bit columns of one tensor-memory lane per thread: thread i of the warp reads lane
// (addr's lane) + i. A warp may only read the 32-lane quarter (warp id % 4).
__device__ __forceinline__ void ld_32x32b_x16(uint32_t addr, uint32_t (&r)[16]) {
  asm volatile(
      "tcgen05.ld.sync.aligned.32x32b.x16.b32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, "
      "%15}, [%16];"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]), "=r"(r[4]), "=r"(r[5]), "=r"(r[6]), "=r"(r[7]), "=r"(r[8]),
        "=r"(r[9]), "=r"(r[10]), "=r"(r[11]), "=r"(r[12]), "=r"(r[13]), "=r"(r[14]), "=r"(r[15])
      : "r"(addr));
  asm volatile("tcgen05.wait::ld.sync.aligned;" ::: "memory");
}

}  // namespace sm100
}  // namespace humming
