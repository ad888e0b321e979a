// In-register dequantization of fragment-layout codes (humming/cuda_kernels/_layout.py) to 16-bit floats.
#include "humming/common.cuh"

namespace humming {

// Four 16-bit-float pairs (A fragments a0a1, a2a3, a4a5, a6a7) from eight 4-bit codes. Register i
// holds nibbles i (low half) and i + 4 (high half); registers 0 and 2 are row g, 1 and 3 row g + 8.
template <DType A>
__device__ __forceinline__ void dequant4(uint32_t w, uint32_t bias_g, uint32_t bias_g8, uint32_t (&a)[4]) {
  constexpr uint32_t kMagic = A == DType::bf16 ? 0x43004300u : 0x64006400u;  // 128.0 / 1024.0
  constexpr uint32_t kOne = A == DType::bf16 ? 0x3f803f80u : 0x3c003c00u;
  constexpr int kAndOr = (0xf0 & 0xcc) | 0xaa;  // (a & b) | c
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t v = lop3<kAndOr>(w >> (4 * i), 0x000f000fu, kMagic);
    a[i] = fma2<A>(v, kOne, (i & 1) ? bias_g8 : bias_g);
  }
}

// The same from eight 8-bit codes in two words: word 0 holds a0..a3, word 1 holds a4..a7.
template <DType A>
__device__ __forceinline__ void dequant8(uint32_t w0, uint32_t w1, float zf_g, float zf_g8, uint32_t bias_g,
                                         uint32_t bias_g8, uint32_t (&a)[4]) {
  if constexpr (A == DType::bf16) {
    // 0x4B0000cc is 8388608 + code as fp32; subtracting 8388608 + zero is exact; the difference
    // (|v| <= 255) is exact in bf16.
    constexpr uint32_t kMagic = 0x4B000000u;
    const uint32_t words[2] = {w0, w1};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t w = words[i >> 1];
      const float z = (i & 1) ? zf_g8 : zf_g;
      const float lo = __uint_as_float(prmt(w, kMagic, (i & 1) ? 0x7542u : 0x7540u)) - z;
      const float hi = __uint_as_float(prmt(w, kMagic, (i & 1) ? 0x7543u : 0x7541u)) - z;
      a[i] = pack2<A>(lo, hi);
    }
  } else {
    // 0x64cc is 1024 + code as fp16.
    constexpr uint32_t kMagic = 0x64646464u;
    constexpr uint32_t kOne = 0x3c003c00u;
    a[0] = fma2<A>(prmt(w0, kMagic, 0x5140u), kOne, bias_g);
    a[1] = fma2<A>(prmt(w0, kMagic, 0x5342u), kOne, bias_g8);
    a[2] = fma2<A>(prmt(w1, kMagic, 0x5140u), kOne, bias_g);
    a[3] = fma2<A>(prmt(w1, kMagic, 0x5342u), kOne, bias_g8);
  }
}

// The same from eight e2m1 codes (sign, 2 exponent bits, 1 mantissa bit; no zero point) in the e2m1
// word layout of _layout.py (E2M1_BITS): the code of register 0 already sits where a bf16 wants it (its
// three magnitude bits at the bottom of the exponent and the top of the mantissa, its sign at the sign
// bit), registers 1 and 2 one shift away, register 3 three. Those bits read as the code's value * 2^-126,
// subnormal for 0.5; one multiply by 2^126 makes it exact (fp16: the magnitude moves up 3 bits, and the
// multiplier is 2^14). Every e2m1 value is exact in either type.
template <DType A>
__device__ __forceinline__ void dequant_e2m1(uint32_t w, uint32_t (&a)[4]) {
  constexpr uint32_t kMag = 0x01c001c0u, kSign = 0x80008000u;
  constexpr int kAndOr = (0xf0 & 0xcc) | 0xaa;  // (a & b) | c
  uint32_t v[4];
  v[0] = w & (kMag | kSign);
  v[1] = (w << 3) & (kMag | kSign);
  v[2] = (w << 6) & (kMag | kSign);
  v[3] = lop3<kAndOr>(w << 1, kSign, lop3<kAndOr>(w >> 5, 0x01000100u, (w >> 4) & 0x00c000c0u));
  constexpr uint32_t kUnit = A == DType::bf16 ? 0x7e807e80u : 0x74007400u;  // 2^126 / 2^14
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t bits = A == DType::bf16 ? v[i] : lop3<kAndOr>(v[i] << 3, kMag << 3, v[i] & kSign);
    a[i] = fma2<A>(bits, kUnit, kSign);  // + (-0.0): the additive identity
  }
}

}  // namespace humming
