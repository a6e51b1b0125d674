"""The packed launcher (:mod:`fmha.launcher`) on the host: its reading of a kernel's signature is the one Triton's
own launcher is generated from, its values are the bytes Triton's launcher passes, and its C module builds and
refuses plans that do not match their arguments without reaching the driver.  The GPU tests of the replayed call
path (tests/test_gpu.py, tests/test_hopper_backward.py) launch real kernels through it."""
import re
import shutil
import struct
from types import SimpleNamespace

import pytest

from fmha import launcher

_FORMAT = {"i1": "b", "i8": "b", "i16": "h", "i32": "i", "i64": "L", "u1": "B", "u8": "B", "u16": "H", "u32": "I",
           "u64": "K", "fp16": "d", "bf16": "d", "fp32": "d", "f32": "d", "fp64": "d"}

META = dict(swizzle=3, elem_size=2, elem_type=8, block_size=[64, 64], fp4_padded=False)


class _Compiled:  # a compiled kernel's stand-in (hashable by identity, as Triton's)
    def __init__(self, signature, metas=None):
        self.src = SimpleNamespace(signature=signature)
        self.metadata = SimpleNamespace(tensordesc_meta=metas)
        self.packed_metadata, self.function = (4, 1, 1024), 77


@pytest.mark.parametrize("signature, metas", [
    ({"X": "*bf16", "n": "i32", "big": "i64", "s": "fp32", "flag": "i1", "B": "constexpr"}, None),
    ({"Q": "tensordesc<bf16[64, 64]>", "O": "*bf16", "n": "i32", "C": "constexpr"}, [META]),
    ({"Q": "tensordesc<bf16[1, 64, 64]>", "K": "tensordesc<bf16[64, 64]>", "m": "i32"}, [META, None]),
    ({"K": "tensordesc<fp16[64]>", "x": "fp64", "h": "fp16", "u": "u64"}, None),
], ids=["plain", "descriptor", "lowered-and-not", "pointer-form"])
def test_types_follow_the_signature_as_tritons_launcher_expands_it(signature, metas):
    """The argument types read off a signature match, one for one, the argument format of the launcher Triton
    generates for it (every descriptor lowered to a CUtensorMap, or to its base pointer, shape and strides)."""
    from triton.backends.nvidia.driver import make_launcher
    src = make_launcher({}, dict(enumerate(signature.values())), metas)
    tritons = re.search(r'PyArg_ParseTuple\(args, "([^"]*)"', src).group(1)[len("iiiKKppOOOOOO"):]
    compiled = _Compiled(signature, metas)
    ours = "".join(_FORMAT.get(ty, "O") for ty in launcher.types(compiled))
    assert ours == tritons


def test_values_are_the_bytes_tritons_launcher_passes():
    assert launcher.value("i32", -3) & 0xFFFFFFFF == struct.unpack("<I", struct.pack("<i", -3))[0]
    assert launcher.value("i64", -3) == struct.unpack("<Q", struct.pack("<q", -3))[0]
    assert launcher.value("i1", True) == 1
    assert launcher.value("fp32", 0.1) == struct.unpack("<I", struct.pack("<f", 0.1))[0]
    assert launcher.value("fp16", 1.5) == 0x3E00
    assert launcher.value("bf16", 1.0 + 2 ** -9) == 0x3F80  # truncated, as Triton's pack_bf16
    assert launcher.value("*bf16", None) == 0 and launcher.value("*bf16", 4096) == 4096
    with pytest.raises(LookupError):
        launcher.value("nvTmaDesc", 0)


def test_a_plan_holds_values_and_the_places_of_the_arguments():
    """Constexprs dropped, each other parameter a slot: its value, or the place among the call's pointers and
    then descriptors; the two scratch pointers last; a patched plan changes only the integers named."""
    compiled = _Compiled({"Q": "tensordesc<bf16[64, 64]>", "O": "*bf16", "n": "i32", "s": "fp32",
                          "C": "constexpr"}, [META])
    tys = launcher.types(compiled)
    flat = [None, 64, 128, 128, 1, None, 100, 0.5, 32]
    plan, at = launcher.plan(compiled, (3, 2, 1), False, True, flat, {0: 1, 5: 0})
    head = launcher.HEADER.unpack_from(plan)
    assert head == (77, 3, 2, 1, 128, 1024, 1, 0, 1, 10, 1, 1, 0)  # (device 0)
    slots = [launcher.SLOT.unpack_from(plan, launcher.HEADER.size + k * launcher.SLOT.size) for k in range(10)]
    assert [(s, v) for s, _, v in slots] == [(1, 0), (-1, 64), (-1, 128), (-1, 128), (-1, 1), (0, 0), (-1, 100),
                                             (-1, launcher.value("fp32", 0.5)), (-1, 0), (-1, 0)]
    assert 8 not in at and at[6] == 6
    places = launcher.value_places(tys, at, [2, 6, 8])
    assert places[2] is None  # (a constexpr: no slot)
    moved = launcher.with_values(plan, places[:2], [256, -101])
    changed = [k for k in range(10) if moved[launcher.HEADER.size + k * 16:][:16] != plan[
        launcher.HEADER.size + k * 16:][:16]]
    assert changed == [2, 6] and launcher.SLOT.unpack_from(moved, launcher.HEADER.size + 2 * 16) == (-1, 0, 256)
    assert launcher.SLOT.unpack_from(moved, launcher.HEADER.size + 6 * 16) == (-1, 0, launcher.value("i32", -101))
    with pytest.raises(LookupError):  # a float that moves: not written as an integer
        launcher.value_places(tys, at, [7])
    with pytest.raises(LookupError):  # a descriptor no argument fills
        launcher.plan(compiled, (1, 1, 1), False, False, flat, {5: 0})
    with pytest.raises(LookupError):  # arguments off the signature
        launcher.plan(compiled, (1, 1, 1), False, False, flat[:-1], {0: 1, 5: 0})
    with pytest.raises(LookupError):  # a tensor where the kernel took a constant
        launcher.check(compiled, flat, {0: 1, 5: 0, 8: 2})
    with pytest.raises(LookupError):  # a type the plan does not pack
        launcher.check(_Compiled({"X": "*fp32", "x": "fp8"}), [None, 1.0], {0: 0})
    assert launcher.value("fp32", 1e39) == 0x7F800000  # (C's double to float: infinite past its range)


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("clang") is None, reason="no C compiler")
def test_the_module_builds_and_refuses_what_does_not_match():
    """Built without a GPU; a plan must match its arguments (count, pointers as integers, descriptors of Triton's
    type) before the driver is opened, and an empty grid launches nothing."""
    mod = launcher.module()
    compiled = _Compiled({"X": "*fp32", "n": "i32"})
    empty, _ = launcher.plan(compiled, (0, 1, 1), False, False, [None, 5], {0: 0})
    assert mod.launch(empty, 0, 4096) is None
    with pytest.raises(ValueError):
        mod.launch(empty, 0)
    with pytest.raises(ValueError):
        mod.launch(bytearray(empty[:-1]), 0, 4096)
    with pytest.raises(TypeError):
        mod.launch(bytes(empty), 0, 4096)
    with pytest.raises(TypeError):
        mod.launch(empty, 0, "not a pointer")
    d_compiled = _Compiled({"D": "tensordesc<bf16[64, 64]>"}, [META])
    with_desc, _ = launcher.plan(d_compiled, (0, 1, 1), False, False, [None, 1, 1, 1, 1], {0: 0})
    mod.setup(SimpleNamespace)
    with pytest.raises(TypeError):
        mod.launch(with_desc, 0, object())
