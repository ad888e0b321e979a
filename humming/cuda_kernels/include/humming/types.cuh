// Fixed-width integer types and the dtype enum (the kernel specs name its values: humming::DType::bf16...).
namespace humming {

typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef int int32_t;

// Scales only: e8m0 codes 1..254 (normal powers of two), e8m0_any any code (0 = 2^-127, 255 = NaN);
// bf16_halves / f16_halves: 16-bit scales of 32-column groups, two per 64-column chunk.
enum class DType : int { f32 = 0, bf16 = 1, f16 = 2, e8m0 = 3, e8m0_any = 4, bf16_halves = 5, f16_halves = 6 };

}  // namespace humming
