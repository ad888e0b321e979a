// Activation quantization to e4m3 with float32 scales, per token (a scale per row) or per group of kGroup
// columns, bit-exact with humming.quantize_activation and its Triton twin (triton_kernels/_act_quant_kernel.py):
// the same float32 arithmetic, step by step, in a kernel the CUDA GEMMs launch from packed parameters.
// - Scale of a span: s = amax / 448 rounded once (amax over the span's finite elements); a span holding NaN /
//   Inf stores a NaN scale, so that the GEMM's epilogue makes its output row NaN.
// - Element: the float32 quotient x * (1 / s), settled on the e4m3 grid as the exact quotient x / s rounds
//   (settled_quotient: within 3 ulps of a midpoint, the sign of |x| - mid * s, one fma, picks the side), then
//   rounded to nearest even by integer additions (encode_rne). Spans of zeros get code 0; NaN / Inf
//   elements the e4m3 NaN code 0x7F.
// - V = bf16 / f16: each code's e4m3 value stored in that 16-bit float type instead of the code (exact), for
//   the WnA16 kernels' fp8-values route; V = f32: the uint8 codes.
// - Layout: x [M, K] of 16-bit floats X, rows x_stride elements apart and 16 bytes aligned, K % 8 == 0;
//   each thread holds 8 consecutive columns (one 16-byte load). Per token (kGroup 0): a block per row, the
//   block's threads strided over it, the absmax reduced across the block; the row is read twice (the second
//   time from L1). Groups (kGroup 16 ... 256, K % kGroup == 0): block (row, j) of kThreads threads takes
//   columns [j, j + 1) * kThreads * 8 of the row, kGroup / 8 neighbouring lanes a group, reduced by shuffles
//   (rows along the grid's x: M may pass the 65535 blocks of y).
// - The pass lets the kernel launched behind it start at once (launch_dependents, common.cuh): the GEMMs that
//   read its output wait for it with grid_dependency_wait.
#include "humming/common.cuh"

namespace humming {
namespace act_quant {

struct Params {
  const void* x;     // [M, K] of X
  void* codes;       // [M, K]: uint8 codes, or 16-bit values of V; rows codes_stride elements apart
  float* scales;     // span j of row r at r * scale_row + j * scale_span
  int M, K;
  int x_stride, codes_stride;
  int scale_row, scale_span;
};

constexpr float kMax = 448.0f;                  // the largest e4m3 value
constexpr float kMinNormal = 0.015625f;         // 2^-6, the smallest normal e4m3 value
constexpr float kSubnormalMagic = 16384.0f;     // 2^14: its float32 ulp is e4m3's subnormal quantum, 2^-9

// What the elements of one span need: its scale s (stored), and s and x moved by one power of two so that
// 1 / s and every residual are normal floats.
struct SpanScale {
  float s, factor, scaled, inverse;
};

__device__ __forceinline__ SpanScale span_scale(float amax) {
  SpanScale r;
  r.s = __fdiv_rn(amax, kMax);
  r.factor = r.s < 1e-12f ? __uint_as_float((127 + 100) << 23) : r.s > 1e12f ? __uint_as_float((127 - 64) << 23) : 1.0f;
  r.scaled = __fmul_rn(r.s, r.factor);
  r.inverse = __fdiv_rn(1.0f, r.scaled == 0.0f ? 1.0f : r.scaled);
  return r;
}

// The e4m3 code of x for its span's scale (triton_kernels/_act_quant_kernel.py: quantize_chunk with
// _settled_quotient and _encode_rne, for e4m3 and float32 scales).
__device__ __forceinline__ uint32_t e4m3_code(float x, const SpanScale& sc) {
  const float xf = __fmul_rn(x, sc.factor);
  const float q = __fmul_rn(xf, sc.inverse);
  const float mag = fminf(fabsf(q), kMax);
  const float lift = mag < kMinNormal ? kMinNormal : 0.0f;
  const uint32_t moved = __float_as_uint(__fadd_rn(mag, lift));
  constexpr uint32_t kFracMask = (1u << 20) - 1, kHalf = 1u << 19;  // 23 - 3 bits below the e4m3 quantum
  const int below = int(moved & kFracMask) - int(kHalf);
  const bool near = below >= -3 && below <= 3;
  const float mid = __fsub_rn(__uint_as_float((moved & ~kFracMask) | kHalf), lift);  // exact (Sterbenz)
  const float side = __fmaf_rn(-mid, sc.scaled, fabsf(xf));
  const uint32_t mid_bits = __float_as_uint(mid);
  const uint32_t settled = side > 0.0f ? mid_bits + 1 : side < 0.0f ? mid_bits - 1 : mid_bits;
  const uint32_t q_bits = (near ? settled : __float_as_uint(mag)) | (__float_as_uint(q) & 0x80000000u);
  // Round to nearest even on the e4m3 grid: normal codes drop 20 mantissa bits, half to even, and rebase the
  // exponent (a carry moves into it); subnormal codes are what adding 2^14 leaves in the low bits.
  const uint32_t sign = q_bits >> 31;
  const float m = fminf(fabsf(__uint_as_float(q_bits)), kMax);
  const uint32_t mb = __float_as_uint(m);
  const uint32_t normal = ((mb + kHalf - 1 + ((mb >> 20) & 1)) >> 20) - (120u << 3);
  const uint32_t subnormal = __float_as_uint(__fadd_rn(m, kSubnormalMagic)) - __float_as_uint(kSubnormalMagic);
  uint32_t code = (sign << 7) | (m < kMinNormal ? subnormal : normal);
  if (sc.s == 0.0f) code = 0;             // a span of zeros (x is finite here or NaN: see below)
  if ((__float_as_uint(x) & 0x7fffffffu) >= 0x7f800000u) code = 0x7F;  // NaN / Inf: the e4m3 NaN
  return code;
}

// The value of an e4m3 code (0x7F / 0xFF: NaN) as float32, exactly.
__device__ __forceinline__ float e4m3_value(uint32_t code) {
  const uint32_t exp_field = (code >> 3) & 0xF, mant = code & 0x7;
  const float mag = exp_field == 0 ? float(mant) * 0.001953125f : __uint_as_float(((exp_field + 120) << 23) | (mant << 20));
  const float value = __uint_as_float(__float_as_uint(mag) | ((code & 0x80) << 24));
  return (code & 0x7F) == 0x7F ? __uint_as_float(0x7fc00000u) : value;
}

// The eight float32 values of 16 bytes of X.
template <DType X>
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = to_float<X>(uint16_t(words[i] & 0xffff));
    f[2 * i + 1] = to_float<X>(uint16_t(words[i] >> 16));
  }
}

// Absmax over the finite elements of f (as the bits of a non-negative float32: they order alike) and whether
// any element is NaN / Inf, accumulated into (top, non_finite).
__device__ __forceinline__ void absmax8(const float (&f)[8], uint32_t& top, bool& non_finite) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t bits = __float_as_uint(f[i]) & 0x7fffffffu;
    const bool finite = bits < 0x7f800000u;
    non_finite |= !finite;
    top = finite && bits > top ? bits : top;
  }
}

// Codes (or values) of the eight elements f for scale sc, stored at column `col` of row `row`.
template <DType V>
__device__ __forceinline__ void store8(const Params& p, int row, int col, const float (&f)[8], const SpanScale& sc) {
  uint32_t code[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) code[i] = e4m3_code(f[i], sc);
  if constexpr (V != DType::f32) {
    uint4 v;
    v.x = pack2<V>(e4m3_value(code[0]), e4m3_value(code[1]));
    v.y = pack2<V>(e4m3_value(code[2]), e4m3_value(code[3]));
    v.z = pack2<V>(e4m3_value(code[4]), e4m3_value(code[5]));
    v.w = pack2<V>(e4m3_value(code[6]), e4m3_value(code[7]));
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.codes) + long(row) * p.codes_stride + col) = v;
  } else {
    uint2 v;
    v.x = code[0] | (code[1] << 8) | (code[2] << 16) | (code[3] << 24);
    v.y = code[4] | (code[5] << 8) | (code[6] << 16) | (code[7] << 24);
    *reinterpret_cast<uint2*>(static_cast<uint8_t*>(p.codes) + long(row) * p.codes_stride + col) = v;
  }
}

template <DType X>
__device__ __forceinline__ uint4 load8(const Params& p, int row, int col) {
  return *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.x) + long(row) * p.x_stride + col);
}

template <DType X, int kGroup, DType V, int kThreads>
__device__ __forceinline__ void run(const Params& p) {
  static_assert(kGroup == 0 || (kGroup >= 16 && kGroup <= 256 && (kGroup & (kGroup - 1)) == 0),
                "per token, or groups of 16 ... 256 columns");
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
  launch_dependents();  // a GEMM launched behind the pass starts its weight loads now (grid_dependency_wait)
  const int vecs = p.K / 8;
  if constexpr (kGroup == 0) {
    const int row = blockIdx.x;
    uint32_t top = 0;
    bool non_finite = false;
    for (int v = threadIdx.x; v < vecs; v += kThreads) {
      float f[8];
      unpack8<X>(load8<X>(p, row, 8 * v), f);
      absmax8(f, top, non_finite);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) top = max(top, __shfl_xor_sync(0xffffffffu, top, o));
    non_finite = __any_sync(0xffffffffu, non_finite);
    __shared__ uint32_t warp_top[kThreads / 32];
    __shared__ int warp_non_finite[kThreads / 32];
    if (threadIdx.x % 32 == 0) {
      warp_top[threadIdx.x / 32] = top;
      warp_non_finite[threadIdx.x / 32] = non_finite;
    }
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) {
      top = max(top, warp_top[w]);
      non_finite |= warp_non_finite[w] != 0;
    }
    const SpanScale sc = span_scale(__uint_as_float(top));
    if (threadIdx.x == 0) p.scales[long(row) * p.scale_row] = non_finite ? __uint_as_float(0x7fc00000u) : sc.s;
    for (int v = threadIdx.x; v < vecs; v += kThreads) {
      float f[8];
      unpack8<X>(load8<X>(p, row, 8 * v), f);
      store8<V>(p, row, 8 * v, f, sc);
    }
  } else {
    constexpr int kLanes = kGroup / 8;  // threads per group (neighbouring lanes of one warp)
    const int row = blockIdx.x, v = blockIdx.y * kThreads + threadIdx.x;
    const bool valid = v < vecs;  // K % kGroup == 0: a group's lanes are all valid or all not
    float f[8] = {};
    if (valid) unpack8<X>(load8<X>(p, row, 8 * v), f);
    uint32_t top = 0;
    bool non_finite = false;
    absmax8(f, top, non_finite);
    int nf = non_finite;
#pragma unroll
    for (int o = kLanes / 2; o > 0; o >>= 1) {
      top = max(top, __shfl_xor_sync(0xffffffffu, top, o));
      nf |= __shfl_xor_sync(0xffffffffu, nf, o);
    }
    if (!valid) return;
    const SpanScale sc = span_scale(__uint_as_float(top));
    if (threadIdx.x % kLanes == 0) {
      p.scales[long(row) * p.scale_row + long(8 * v / kGroup) * p.scale_span] = nf ? __uint_as_float(0x7fc00000u) : sc.s;
    }
    store8<V>(p, row, 8 * v, f, sc);
  }
}

}  // namespace act_quant
}  // namespace humming
