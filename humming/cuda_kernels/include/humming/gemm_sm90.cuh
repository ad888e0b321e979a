// Hopper (sm_90a) weight-only GEMM for large M: out[M, N] = x[M, K] @ dequant(W[N, K])^T.
//
// The kernel computes out^T tile by tile so that the quantized weights are the wgmma A operand, which
// Hopper lets come from registers: the weights never go through shared memory in 16-bit form.
// - Block tile: 128 weight rows x kBM (16, 32, 64, 128 or 256) tokens, K in 64-column chunks;
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
//   B = shared-memory descriptor), fp32 accumulators in registers.
// - Grouped (MoE) variant, kGrouped: the weights are E experts stacked as extra 128-row blocks
//   (expert e's block b is block e * N/128 + b, likewise for scales, zero points and bias [E, N]); x
//   rows are grouped by expert in segments of block_m rows (kBM divides block_m), and expert_ids[i] is
//   the expert of rows [i * block_m, (i + 1) * block_m), -1 for unused segments, whose tiles return at once.
#include "humming/dequant.cuh"

namespace humming {
namespace gemm_sm90 {

struct alignas(64) TensorMap {
  uint64_t opaque[16];
};

struct alignas(64) Params {
  TensorMap x_map;       // x [M, K], box 64 x kBM, 128-byte swizzle
  const uint4* qweight;  // fragment layout, tile group 8
  const void* scales;    // [N/128, groups, 8, 8, 2]
  const uint16_t* zeros; // [N/128, groups, 8, 8, 2] or null
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
};

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

__device__ __forceinline__ void tma_load_2d(uint32_t dst, const TensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// Shared-memory matrix descriptor of a K-major operand tile stored with the 128-byte swizzle: rows of
// 128 bytes, 8-row core-matrix groups 1024 bytes apart; the tile starts 1024-byte aligned.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// d[64 x 16] (+)= a[64 x 16] (registers) * b[16 x 16] (shared memory, K-major), fp32 accumulators.
template <DType A>
__device__ __forceinline__ void wgmma_m64n16k16_rs(float (&d)[8], const uint32_t (&a)[4], uint64_t b_desc,
                                                   int accumulate) {
  if constexpr (A == DType::bf16) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
  } else {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
  }
}

// d[64 x 32] (+)= a[64 x 16] (registers) * b[16 x 32] (shared memory, K-major), fp32 accumulators.
template <DType A>
__device__ __forceinline__ void wgmma_m64n32k16_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t b_desc,
                                                   int accumulate) {
  if constexpr (A == DType::bf16) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
  } else {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
  }
}

// d[64 x 64] (+)= a[64 x 16] (registers) * b[16 x 64] (shared memory, K-major), fp32 accumulators.
template <DType A>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc,
                                                   int accumulate) {
  if constexpr (A == DType::bf16) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
  } else {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
  }
}

// d[64 x 128] (+)= a[64 x 16] (registers) * b[16 x 128] (shared memory, K-major), fp32 accumulators.
template <DType A>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b_desc,
                                                    int accumulate) {
  if constexpr (A == DType::bf16) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
  } else {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
  }
}

// d[64 x 256] (+)= a[64 x 16] (registers) * b[16 x 256] (shared memory, K-major), fp32 accumulators.
template <DType A>
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t b_desc,
                                                    int accumulate) {
  if constexpr (A == DType::bf16) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
  } else {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
  }
}

template <DType A, int kBM>
__device__ __forceinline__ void wgmma_rs(float (&d)[kBM / 2], const uint32_t (&a)[4], uint64_t b_desc, int accumulate) {
  if constexpr (kBM == 16) {
    wgmma_m64n16k16_rs<A>(d, a, b_desc, accumulate);
  } else if constexpr (kBM == 32) {
    wgmma_m64n32k16_rs<A>(d, a, b_desc, accumulate);
  } else if constexpr (kBM == 64) {
    wgmma_m64n64k16_rs<A>(d, a, b_desc, accumulate);
  } else if constexpr (kBM == 128) {
    wgmma_m64n128k16_rs<A>(d, a, b_desc, accumulate);
  } else {
    static_assert(kBM == 256, "token tile of 16, 32, 64, 128 or 256");
    wgmma_m64n256k16_rs<A>(d, a, b_desc, accumulate);
  }
}

template <int kBits, int kZero, DType S, int kBM, int kStages>
struct SmemLayout {
  static constexpr int kXBytes = kBM * 128;                 // activation tile, 1024-byte aligned
  static constexpr int kWBytes = 128 * 64 * kBits / 8;      // weight chunk of 128 rows
  static constexpr int kSBytes = 128 * (S == DType::f32 ? 4 : 2);
  static constexpr int kZBytes = kZero < 0 ? 128 * 2 : 0;
  static constexpr int kX = 0;
  static constexpr int kW = kX + kStages * kXBytes;
  static constexpr int kS = kW + kStages * kWBytes;
  static constexpr int kZ = kS + kStages * kSBytes;
  static constexpr int kBar = kZ + kStages * kZBytes;       // full[kStages], empty[kStages]
  static constexpr int kTotal = kBar + 2 * kStages * 8;
};

template <DType A, int kBits, int kZero, DType S, DType O, DType B, int kBM, int kStages, bool kGrouped,
          int kBlocksPerSm>
__device__ __forceinline__ void run(const Params& p) {
  static_assert(kBlocksPerSm == 1 || kBlocksPerSm == 2, "one or two blocks per SM");
  // 128 * producer + 256 * consumer registers must fit the 384 * (65536 / 384 / kBlocksPerSm, rounded
  // down to 8) the block launches with (168 or 80 per thread).
  constexpr int kProducerRegs = kBlocksPerSm == 1 ? 40 : 24;
  constexpr int kConsumerRegs = kBlocksPerSm == 1 ? 232 : 104;
  using L = SmemLayout<kBits, kZero, S, kBM, kStages>;
  constexpr int kVecs = kBits / 4;
  constexpr uint32_t kStageTx = L::kXBytes + L::kWBytes + L::kSBytes + L::kZBytes;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // The dynamic shared memory base is only 16-byte aligned by default: align to 1024 by hand
  // (decode.py reserves the slack).
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t full0 = base + L::kBar, empty0 = full0 + kStages * 8;

  const int wg = threadIdx.x / 128;
  const int m0 = blockIdx.y * kBM;  // first token of the tile
  int expert = 0;
  if constexpr (kGrouped) {
    expert = p.expert_ids[m0 / p.block_m];
    if (expert < 0) return;  // the whole block: before any barrier
  }
  const int blk = expert * (p.N / 128) + blockIdx.x;  // 128-row block of the (stacked) weights
  const int n_chunks = p.K / 64;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, 256);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
    if (threadIdx.x == 0) {
      const char* w_src = reinterpret_cast<const char*>(p.qweight);
      const char* s_src = static_cast<const char*>(p.scales);
      const char* z_src = reinterpret_cast<const char*>(p.zeros);
      for (int kc = 0; kc < n_chunks; ++kc) {
        const int s = kc % kStages;
        if (kc >= kStages) mbar_wait(empty0 + 8 * s, ((kc / kStages) & 1) ^ 1);
        const uint32_t full = full0 + 8 * s;
        mbar_expect_tx(full, kStageTx);
        tma_load_2d(base + L::kX + s * L::kXBytes, &p.x_map, kc * 64, m0, full);
        bulk_load(base + L::kW + s * L::kWBytes, w_src + (long(blk) * n_chunks + kc) * L::kWBytes, L::kWBytes, full);
        const long group_block = long(blk) * p.groups + kc / p.chunks_per_group;
        bulk_load(base + L::kS + s * L::kSBytes, s_src + group_block * L::kSBytes, L::kSBytes, full);
        if constexpr (kZero < 0) {
          bulk_load(base + L::kZ + s * L::kZBytes, z_src + group_block * L::kZBytes, L::kZBytes, full);
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
    const int t = threadIdx.x - 128;      // 0..255 over both consumer warpgroups
    const int tile = t / 32;              // 16-row tile of the block: warp w of consumer c has 4c + w
    const int lane = t & 31;
    const int g = lane >> 2, c = lane & 3;
    constexpr float kMagicF = kBits == 8 && A == DType::bf16 ? 8388608.0f : (A == DType::bf16 ? 128.0f : 1024.0f);
    constexpr uint32_t kNegZero = 0x80008000u;
    float acc[kBM / 2];
    // Wait for chunk kc, load this lane's weight fragment, scales and zero points, and dequantize its
    // four k16 steps into a (w = (q - z) * s, rounded once to the activation type).
    auto load_dequant = [&](int kc, uint32_t (&a)[4][4]) {
      const int s = kc % kStages;
      mbar_wait(full0 + 8 * s, (kc / kStages) & 1);
      const uint4* w = reinterpret_cast<const uint4*>(smem + L::kW + s * L::kWBytes) + tile * kVecs * 32 + lane;
      uint4 wv[kVecs];
#pragma unroll
      for (int v = 0; v < kVecs; ++v) wv[v] = w[v * 32];
      float s_g, s_g8;
      if constexpr (S == DType::f32) {
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
      const uint32_t* words = reinterpret_cast<const uint32_t*>(&wv[0]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (kBits == 4) {
          dequant4<A>(words[j], bias_g, bias_g8, a[j]);
        } else {
          dequant8<A>(words[2 * j], words[2 * j + 1], zf_g, zf_g8, bias_g, bias_g8, a[j]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) a[j][i] = fma2<A>(a[j][i], (i & 1) ? scale_g8 : scale_g, kNegZero);
      }
    };
    auto issue_mma = [&](int kc, const uint32_t (&a)[4][4]) {
      const uint64_t desc = sw128_desc(base + L::kX + (kc % kStages) * L::kXBytes);
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < 4; ++j) wgmma_rs<A, kBM>(acc, a[j], desc + 2 * j, kc > 0 || j > 0);
      wgmma_commit();
    };
    // One chunk at a time: the dequantized A registers must stay untouched until the wgmmas that read
    // them complete, and ptxas serializes wgmmas whose register inputs are written while earlier ones
    // are in flight (C7513), so the overlap of dequantization and tensor-core work comes from the two
    // consumer warpgroups taking turns.
    for (int kc = 0; kc < n_chunks; ++kc) {
      uint32_t a[4][4];
      load_dequant(kc, a);
      issue_mma(kc, a);
      wgmma_wait<0>();
      mbar_arrive(empty0 + 8 * (kc % kStages));
    }
    // acc[4i + e]: weight row tile*16 + g + 8 * (e >> 1), token m0 + 8i + 2c + (e & 1).
    const long n_base = long(blockIdx.x) * 128 + tile * 16 + g;  // column of out (row of the expert)
#pragma unroll
    for (int i = 0; i < kBM / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int token = m0 + 8 * i + 2 * c + (e & 1);
        const long n = n_base + 8 * (e >> 1);
        if (token < p.M) {
          float v = acc[4 * i + e];
          if (p.x_scale != nullptr) v *= p.x_scale[token * p.x_scale_stride];
          if (p.bias != nullptr) v += load_float<B>(p.bias, long(expert) * p.N + n);
          store_float<O>(p.out, long(token) * p.out_stride + n, v);
        }
      }
  }
}

}  // namespace gemm_sm90
}  // namespace humming
