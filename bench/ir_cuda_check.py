import torch, humming
from humming.ir.formats import get_format, FORMATS
torch.manual_seed(0)
bad = []
for f in FORMATS:
    if f.kind not in ("float", "int", "lut", "e8m0"):
        continue
    x = torch.randn(4096, dtype=torch.float64) * (f.max_value / 3 if f.kind != "e8m0" else 10)
    if f.kind == "e8m0": x = x.abs() + 1e-3
    a = f.encode(x); b = f.encode(x.cuda()).cpu()
    if not torch.equal(a, b):
        i = (a != b).nonzero()[:3].flatten()
        bad.append((f.name, int((a != b).sum()), x[i].tolist(), a[i].tolist(), b[i].tolist()))
    if not torch.equal(f.decode(a), f.decode(a.cuda()).cpu()) and not f.has_nan:
        bad.append((f.name, "decode"))
print("encode/decode CPU vs CUDA mismatches:", bad)
w = torch.randn(256, 512)
for kw in [dict(weight="e4m3", group_size=-1), dict(weight="int4"), dict(weight="nvfp4"), dict(weight="mxfp4")]:
    q1 = humming.quantize(w, **kw); q2 = humming.quantize(w.cuda(), **kw)
    print(kw, "qweight equal", torch.equal(q1.qweight, q2.qweight.cpu()), "scales equal", torch.equal(q1.scales.float(), q2.scales.float().cpu()), "deq nan", bool(humming.dequantize(q2).isnan().any()))
