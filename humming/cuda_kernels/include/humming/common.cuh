// Shared device helpers for humming's CUDA kernels. Self-contained: no CUDA toolkit headers, so NVRTC
// needs no include path and the JIT cache key (which hashes every included file) is complete.
#include "humming/types.cuh"

namespace humming {

// The 32-bit shared-window address of a generic pointer into shared memory: the operand form of every
// PTX instruction that names shared memory (cp.async, ldmatrix, mbarrier, TMA, tcgen05, descriptors).
__device__ __forceinline__ uint32_t smem_addr(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// Asynchronous global -> shared copies (sm_80+), completed with commit / wait groups.
// `dst` is a shared-memory address (smem_addr).
__device__ __forceinline__ void cp_async_cg16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}

// 16 bytes, or 16 zero bytes (nothing read) when !valid; L2 only.
__device__ __forceinline__ void cp_async_cg16_zfill(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

// kBytes (4, 8 or 16), or kBytes zero bytes (nothing read) when !valid.
template <int kBytes>
__device__ __forceinline__ void cp_async_ca_zfill(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(dst), "l"(src), "n"(kBytes),
               "r"(valid ? kBytes : 0));
}

template <int kBytes>
__device__ __forceinline__ void cp_async_ca(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(dst), "l"(src), "n"(kBytes));
}

// Adds `v` to the fp32 at `ptr` in L2 (no return value: SASS REDG.E.ADD.F32): split-K / stream-K partial sums.
__device__ __forceinline__ void red_add_f32(float* ptr, float v) {
  asm volatile("red.global.add.f32 [%0], %1;" ::"l"(ptr), "f"(v) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}


// Programmatic dependent launch (sm_90+; no-ops below, and where the launch did not ask for it). A GEMM
// launched right behind humming's own activation pass (PackedLaunch(programmatic=True)) may start while that
// pass runs: before grid_dependency_wait it reads only what no kernel of the call writes (the weights, their
// scales), after it everything the pass wrote is visible. The pass lets its dependents start at once.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Four 8x8 b16 matrices from shared memory; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x4(const void* row, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_addr(row)));
}

template <int kLut>
__device__ __forceinline__ uint32_t lop3(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, %4;" : "=r"(d) : "r"(a), "r"(b), "r"(c), "n"(kLut));
  return d;
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
  return d;
}

// a * b + c on two 16-bit floats of type A packed in 32 bits.
template <DType A>
__device__ __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  if constexpr (A == DType::bf16) {
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  } else {
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  }
  return d;
}

// Two floats to two 16-bit floats of type A (lo in the low half), rounded to nearest even.
template <DType A>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t d;
  if constexpr (A == DType::bf16) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  }
  return d;
}

template <DType T>
__device__ __forceinline__ float to_float(uint16_t bits) {
  if constexpr (T == DType::bf16) {
    return __uint_as_float(uint32_t(bits) << 16);
  } else {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
    return f;
  }
}

// An e8m0 scale code (OCP MX: 2^(code - 127), 255 = NaN) as fp32; code 0 is the subnormal 2^-127.
__device__ __forceinline__ float e8m0_to_float(uint32_t code) {
  return __uint_as_float(code == 0 ? 0x00400000u : code == 255 ? 0x7fc00000u : code << 23);
}

template <DType T>
__device__ __forceinline__ uint16_t from_float(float f) {
  uint16_t d;
  if constexpr (T == DType::bf16) {
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(d) : "f"(f));
  } else {
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(d) : "f"(f));
  }
  return d;
}

// Load element i of a tensor of dtype T as float.
template <DType T>
__device__ __forceinline__ float load_float(const void* base, long i) {
  if constexpr (T == DType::f32) {
    return static_cast<const float*>(base)[i];
  } else {
    return to_float<T>(static_cast<const uint16_t*>(base)[i]);
  }
}

template <DType T>
__device__ __forceinline__ void store_float(void* base, long i, float v) {
  if constexpr (T == DType::f32) {
    static_cast<float*>(base)[i] = v;
  } else {
    static_cast<uint16_t*>(base)[i] = from_float<T>(v);
  }
}

// D = A * B + D, m16n8k16, 16-bit float inputs of type A, fp32 accumulators.
template <DType A>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (A == DType::bf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// The gated activations of the grouped kernels' fused w13 epilogues (kAct), in fp32, as in
// humming.reference.moe_layer.
enum Act : int { kNoAct = 0, kSilu = 1, kGelu = 2, kGeluTanh = 3, kSwigluOai = 4 };

template <int kAct>
__device__ __forceinline__ float gated(float gate, float up, float alpha, float limit) {
  if constexpr (kAct == kSilu) {
    return gate / (1.0f + expf(-gate)) * up;
  } else if constexpr (kAct == kGelu) {
    return 0.5f * gate * (1.0f + erff(gate * 0.70710678118654752f)) * up;
  } else if constexpr (kAct == kGeluTanh) {
    const float y = 0.7978845608028654f * (gate + 0.044715f * gate * gate * gate);
    return 0.5f * gate * (1.0f + tanhf(y)) * up;
  } else {
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
    return gate / (1.0f + expf(-alpha * gate)) * (up + 1.0f);
  }
}

}  // namespace humming
