#!/usr/bin/env python3
"""Writes the pytorch_bin fuzz seeds (fuzz/corpus/pytorch_bin/) without torch: Python's own
pickler, fake `torch` globals of the same names, and zipfile, giving the byte stream torch.save
writes (protocol 2, persistent ids ('storage', type, key, 'cpu', numel)). tests/test_pytorch_bin.cpp
reads these files and checks their tensors against the values below.

  zip-strided.bin   a zip checkpoint: "a" = arange(6) f32 as [2, 3]; "t" = its transpose (stride
                    [1, 3]) on the same storage; "h" = [1.5, -2] bf16; "o" = the last 2 elements of
                    storage 0 (offset 4, [2]); "p" = a Parameter wrapping [2, 3] of 7 .. 12 f32
  legacy.bin        the legacy (pre-1.6) layout of "a" and "h"
"""
import collections, io, pickle, struct, sys, types, zipfile, os

torch = types.ModuleType("torch"); utils = types.ModuleType("torch._utils")
torch._utils = utils
sys.modules["torch"] = torch; sys.modules["torch._utils"] = utils
def _rebuild_tensor_v2(*a): pass
def _rebuild_parameter(*a): pass
for f in (_rebuild_tensor_v2, _rebuild_parameter):
    f.__module__ = "torch._utils"; setattr(utils, f.__name__, f)
class FloatStorage: pass
class BFloat16Storage: pass
for c in (FloatStorage, BFloat16Storage):
    c.__module__ = "torch"; setattr(torch, c.__name__, c)

class Storage:
    def __init__(self, key, typ, data, esize): self.key, self.typ, self.data, self.esize = key, typ, data, esize
class Tensor:
    def __init__(self, st, off, size, stride): self.a = (st, off, size, stride, False, collections.OrderedDict())
    def __reduce__(self): return (_rebuild_tensor_v2, self.a)
class Param:
    def __init__(self, t): self.t = t
    def __reduce__(self): return (_rebuild_parameter, (self.t, True, collections.OrderedDict()))

def bf16(x): return struct.pack("<f", x)[2:]
s0 = Storage("0", FloatStorage, struct.pack("<6f", *range(6)), 4)
s1 = Storage("1", BFloat16Storage, bf16(1.5) + bf16(-2.0), 2)
s2 = Storage("2", FloatStorage, struct.pack("<6f", *range(7, 13)), 4)

class P(pickle.Pickler):
    def __init__(self, f, legacy):
        super().__init__(f, protocol=2); self.legacy = legacy
    def persistent_id(self, o):
        if isinstance(o, Storage):
            n = len(o.data) // o.esize
            return ("storage", o.typ, o.key, "cpu", n) + ((None,) if self.legacy else ())
        return None

def dump(obj, legacy):
    b = io.BytesIO(); P(b, legacy).dump(obj); return b.getvalue()

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "pytorch_bin")
state = {"a": Tensor(s0, 0, (2, 3), (3, 1)), "t": Tensor(s0, 0, (3, 2), (1, 3)), "h": Tensor(s1, 0, (2,), (1,)),
         "o": Tensor(s0, 4, (2,), (1,)), "p": Param(Tensor(s2, 0, (2, 3), (3, 1)))}
with zipfile.ZipFile(os.path.join(here, "zip-strided.bin"), "w", zipfile.ZIP_STORED) as z:
    z.writestr("archive/data.pkl", dump(state, False))
    z.writestr("archive/byteorder", "little")
    for s in (s0, s1, s2): z.writestr("archive/data/" + s.key, s.data)

with open(os.path.join(here, "legacy.bin"), "wb") as f:
    f.write(pickle.dumps(0x1950a86a20f9469cfc6c, protocol=2))
    f.write(pickle.dumps(1001, protocol=2))
    f.write(pickle.dumps({"protocol_version": 1001, "little_endian": True,
                          "type_sizes": {"short": 2, "int": 4, "long": 4}}, protocol=2))
    f.write(dump({"a": Tensor(s0, 0, (2, 3), (3, 1)), "h": Tensor(s1, 0, (2,), (1,))}, True))
    f.write(pickle.dumps(["0", "1"], protocol=2))
    for s in (s0, s1): f.write(struct.pack("<q", len(s.data) // s.esize) + s.data)
