// fused_moe's weighted combine: out[t] = sum_j weights[t, j] * y[row of slot (t, j)], the slots in order,
// accumulated in fp32 with one fma each and rounded once to O: the bits of the Triton combine
// (triton_kernels/moe_layer.py, _combine_kernel, whose `acc += w * y` Triton contracts into fma), in a kernel
// launched from packed parameters (the host cost of a Triton launch is most of a one-token layer's).
// - Rows: slot_rows[t * topk + j] (-1: the slot adds nothing); with slot_block > 0 (slot-major rows of one
//   token) slot_rows holds the slots' expert ids, and slot s has row s * slot_block where its id is in
//   [0, num_experts).
// - Each thread takes 8 columns (one 16-byte load of y per slot, one 16-byte store): H % 8 == 0, y and out
//   rows 16-byte aligned. Grid (T, cdiv(H, 8 * kThreads)): tokens along x, which takes more than 65535.
// - Launched programmatically (PackedLaunch): it waits for the kernel before it first (grid_dependency_wait).
#include "humming/common.cuh"

namespace humming {
namespace moe_combine {

struct Params {
  const void* y;         // [M_pad, H] of Y, rows y_stride elements apart
  const int* slot_rows;  // [T * topk]
  const void* weights;   // [T, topk] of W, strides (weight_t, weight_j)
  void* out;             // [T, H] of O, rows out_stride elements apart
  int H, y_stride, weight_t, weight_j, out_stride;
  int num_experts, topk, slot_block;
};

template <DType Y, DType W, DType O, int kThreads>
__device__ __forceinline__ void run(const Params& p) {
  static_assert(Y != DType::f32 && O != DType::f32, "16-bit y and out");
  grid_dependency_wait();  // launched programmatically behind w2: y is its output
  const int t = blockIdx.x, col = 8 * (blockIdx.y * kThreads + threadIdx.x);
  if (col >= p.H) return;
  float acc[8] = {};
  for (int j = 0; j < p.topk; ++j) {
    const int slot = t * p.topk + j;
    int row = __ldg(p.slot_rows + slot);
    if (p.slot_block > 0) row = row >= 0 && row < p.num_experts ? slot * p.slot_block : -1;
    if (row < 0) continue;
    const float w = load_float<W>(p.weights, long(t) * p.weight_t + long(j) * p.weight_j);
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.y) + long(row) * p.y_stride + col));
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc[2 * i] = __fmaf_rn(w, to_float<Y>(uint16_t(words[i] & 0xffff)), acc[2 * i]);
      acc[2 * i + 1] = __fmaf_rn(w, to_float<Y>(uint16_t(words[i] >> 16)), acc[2 * i + 1]);
    }
  }
  uint4 o;
  o.x = pack2<O>(acc[0], acc[1]);
  o.y = pack2<O>(acc[2], acc[3]);
  o.z = pack2<O>(acc[4], acc[5]);
  o.w = pack2<O>(acc[6], acc[7]);
  *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + long(t) * p.out_stride + col) = o;
}

}  // namespace moe_combine
}  // namespace humming
