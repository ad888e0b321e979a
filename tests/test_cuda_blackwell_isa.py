"""What ptxas accepts on Blackwell's tensor cores (the facts behind humming/cuda_kernels/BLACKWELL.md).

Each probe is one inline-PTX instruction compiled by NVRTC for one target; the test asserts which
targets accept it, so a toolchain that changes the answer is noticed. Compiles only: no GPU needed.
"""

from __future__ import annotations

import pytest

from humming.cuda_kernels import jit

pytestmark = pytest.mark.skipif(
    jit.compiler_unavailable_reason() is not None, reason=f"{jit.compiler_unavailable_reason()}"
)

_F8F6F4 = """float d0 = 0, d1 = 0, d2 = 0, d3 = 0;
asm volatile("mma.sync.aligned.m16n8k32.row.col.kind::f8f6f4.f32.{a}.{b}.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}},"
             " {{%8,%9}}, {{%0,%1,%2,%3}};" : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
             : "r"(o[0]), "r"(o[1]), "r"(o[2]), "r"(o[3]), "r"(o[4]), "r"(o[5]));
o[threadIdx.x] = __float_as_uint(d0 + d1 + d2 + d3);"""
_BLOCK_SCALED = """float d0 = 0, d1 = 0, d2 = 0, d3 = 0;
asm volatile("mma.sync.aligned.m16n8k{k}.row.col.kind::{kind}.block_scale.scale_vec::{vec}.f32.{a}.e2m1.f32.{sf}"
             " {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}}, %10, {{0, 0}}, %11, {{0, 0}};"
             : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
             : "r"(o[0]), "r"(o[1]), "r"(o[2]), "r"(o[3]), "r"(o[4]), "r"(o[5]), "r"(o[6]), "r"(o[7]));
o[threadIdx.x] = __float_as_uint(d0 + d1 + d2 + d3);"""
_TCGEN05 = """asm volatile("tcgen05.mma.cta_group::1.kind::{kind} [%0], %1, %2, %3, 1;"
             :: "r"(o[0]), "l"(q[0]), "l"(q[1]), "r"(o[1]));"""
_TCGEN05_BLOCK_SCALED = """asm volatile("tcgen05.mma.cta_group::1.kind::{kind}.block_scale.scale_vec::{vec}"
             " [%0], %1, %2, %3, [%4], [%5], 1;"
             :: "r"(o[0]), "l"(q[0]), "l"(q[1]), "r"(o[1]), "r"(o[2]), "r"(o[3]));"""
_TCGEN05_CP = """asm volatile("tcgen05.cp.cta_group::1.32x128b.warpx4 [%0], %1;" :: "r"(o[0]), "l"(q[0]));"""
_CVT = """unsigned short h;
asm volatile("cvt.rn.satfinite.{t}x2.f32 %0, %1, %2;"
             : "=h"(h) : "f"(__uint_as_float(o[0])), "f"(__uint_as_float(o[1])));
o[2] = h;"""

PROBES = [
    # (name, body, {arch: expected to compile})
    *[
        (
            f"mma.sync f8f6f4 {a} x e2m1",
            _F8F6F4.format(a=a, b="e2m1"),
            {"sm_120a": True, "sm_100a": False, "sm_90a": False},
        )
        for a in ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")
    ],
    *[
        (f"mma.sync f8f6f4 {a} (no such type)", _F8F6F4.format(a=a, b="e2m1"), {"sm_120a": False, "sm_100a": False})
        for a in ("e0m3", "e3m4", "e8m0", "s8")
    ],
    (
        "mma.sync mxf4nvf4 ue4m3 4X",
        _BLOCK_SCALED.format(k=64, kind="mxf4nvf4", vec="4X", a="e2m1", sf="ue4m3"),
        {"sm_120a": True, "sm_100a": False},
    ),
    (
        "mma.sync mxf8f6f4 ue8m0 1X",
        _BLOCK_SCALED.format(k=32, kind="mxf8f6f4", vec="1X", a="e3m2", sf="ue8m0"),
        {"sm_120a": True, "sm_100a": False},
    ),
    *[
        (f"tcgen05.mma kind::{kind}", _TCGEN05.format(kind=kind), {"sm_100a": True, "sm_120a": False, "sm_90a": False})
        for kind in ("f16", "tf32", "f8f6f4", "i8")
    ],
    *[
        (
            f"tcgen05.mma kind::{kind} block_scale {vec}",
            _TCGEN05_BLOCK_SCALED.format(kind=kind, vec=vec),
            {"sm_100a": True, "sm_120a": False, "sm_90a": False},
        )
        for kind, vec in (("mxf4nvf4", "4X"), ("mxf4nvf4", "2X"), ("mxf4", "2X"), ("mxf8f6f4", "1X"))
    ],
    ("tcgen05.cp 32x128b.warpx4", _TCGEN05_CP, {"sm_100a": True, "sm_120a": False}),
    *[(f"cvt {t}x2", _CVT.format(t=t), {"sm_100a": True, "sm_120a": True, "sm_90a": False}) for t in ("e2m3", "e3m2")],
    *[(f"cvt {t}x2 (no such type)", _CVT.format(t=t), {"sm_100a": False, "sm_120a": False}) for t in ("e0m3", "e3m4")],
]


def _compiles(body: str, arch: str) -> bool:
    from cuda.core import Program, ProgramOptions

    source = 'extern "C" __global__ void probe(unsigned* o, unsigned long long* q) {\n' + body + "\n}\n"
    try:
        Program(source, "c++", ProgramOptions(arch=arch, std="c++17")).compile("cubin")
    except Exception as exc:  # NVRTC's error carries ptxas's diagnostic
        assert "error" in str(exc).lower(), exc
        return False
    return True


@pytest.mark.parametrize(("name", "body", "expected"), PROBES, ids=[p[0] for p in PROBES])
def test_tensor_core_types(name, body, expected):
    got = {arch: _compiles(body, arch) for arch in expected}
    assert got == expected, name
