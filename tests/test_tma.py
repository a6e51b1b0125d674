"""The TMA views (:mod:`fmha.kernels.tma`) on the host: every element a kernel addresses through a view
is the tensor's own, the view stays inside the storage, and layouts TMA cannot read are refused."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fmha.bench.layouts import LAYOUTS, arrange
from fmha.kernels import tma

SHAPES = [(2, 4, 2, 48, 64), (1, 3, 3, 1, 128), (3, 1, 1, 17, 64), (1, 8, 1, 5, 128)]  # (b, h, kv_heads, s, d)


def _through(t, view, kind):
    """``t`` (bhsd) gathered element by element through ``view``, as the kernels address it."""
    base = torch.as_strided(t, view.shape, view.strides)  # raises if the view leaves the storage
    b, h, s, d = t.shape
    out = torch.empty_like(t)
    for i in range(b):
        for j in range(h):
            first = i * view.batch + j * view.head
            cols = slice(j * view.col, j * view.col + d)
            out[i, j] = base[first:first + s, cols] if kind == "rows" else base[first, :s, cols]
    return out


def _bhsd_as(t, layout):
    return t if layout == "bhsd" else t.transpose(1, 2)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("arrangement", LAYOUTS)
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_views_address_the_tensor(layout, arrangement, shape):
    b, h, kvh, s, d = shape
    g = torch.Generator().manual_seed(s)
    q = torch.randn(b, h, s, d, generator=g, dtype=torch.float16)
    k, v = (torch.randn(b, kvh, s, d, generator=g, dtype=torch.float16) for _ in range(2))
    q, k, v = arrange(q, k, v, arrangement)
    for t, view, kind in ((q, tma.rows_view, "rows"), (k, tma.kv_view, "kv"), (v, tma.kv_view, "kv")):
        w = view(_bhsd_as(t, layout), layout)
        assert w is not None, (arrangement, t.stride())
        assert torch.equal(_through(t, w, kind), t)
    assert tma.reason((_bhsd_as(q, layout), _bhsd_as(k, layout), _bhsd_as(v, layout), _bhsd_as(q, layout)),
                      layout) is None


@pytest.mark.parametrize("d", [64, 96])
@pytest.mark.parametrize("arrangement", LAYOUTS)
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_exact_descriptors_end_at_head_dim(layout, arrangement, d):
    """The descriptors the Gluon kernel reads (one rank above the view, head_dim its own dimension) address
    the tensor's elements, and the last dimension ends at head_dim: a box padded past it (96 in 128) reads
    TMA's zeros, never the next head's columns."""
    g = torch.Generator().manual_seed(d)
    q = torch.randn(2, 4, 40, d, generator=g, dtype=torch.float16)
    k, v = (torch.randn(2, 2, 40, d, generator=g, dtype=torch.float16) for _ in range(2))
    for t, view, kind in zip(arrange(q, k, v, arrangement), (tma.rows_view, tma.kv_view, tma.kv_view),
                             ("rows", "kv", "kv")):
        w = view(_bhsd_as(t, layout), layout)
        shape, strides = tma.exact(_bhsd_as(t, layout), w, layout)
        assert shape[-1] == d and strides[-1] == 1
        base = torch.as_strided(t, shape, strides)
        for i in range(t.shape[0]):
            for j in range(t.shape[1]):
                at, first = j if w.col else 0, i * w.batch + j * w.head
                got = base[at, first:first + t.shape[2]] if kind == "rows" else base[at, first, :t.shape[2]]
                assert torch.equal(got, t[i, j])


@st.composite
def strided(draw):
    """A ``[b, h, s, d]`` tensor over a storage of its own with any strides: each dimension's stride a small multiple
    of 8 elements or of a row, 0 (a broadcast, as ``expand`` makes) included, head_dim unit-stride or not, the pointer
    aligned or 2 bytes off; and the layout it is read as."""
    b, h, s = draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 5, 16]))
    d = draw(st.sampled_from([8, 24, 64]))
    unit = draw(st.sampled_from([1, 8, d]))
    strides = [draw(st.sampled_from([0, 1, 2, 3, 5, 8, 40])) * unit for _ in range(3)]
    strides.append(draw(st.sampled_from([1, 1, 1, 2])))
    offset = draw(st.sampled_from([0, 8, 1]))
    size = offset + sum((n - 1) * x for n, x in zip((b, h, s, d), strides)) + 1
    storage = torch.randn(size, generator=torch.Generator().manual_seed(size), dtype=torch.float16)
    return torch.as_strided(storage, (b, h, s, d), strides, offset), draw(st.sampled_from(["bhsd", "bshd"]))


@settings(max_examples=400, deadline=None)
@given(strided())
def test_any_strides_read_through_a_view_are_the_tensor(case):
    """Whatever the strides (overlapping ones and broadcasts among them), a view the kernels get addresses each
    (batch, head) sequence's own elements and stays inside the storage; where no view can, there is none (a
    sequence broadcast from one row, stride 0, was read as the rows after it; a batch broadcast into K or V with
    heads side by side, as the next batch's keys)."""
    t, layout = case
    storage = torch.tensor([], dtype=t.dtype).set_(t.untyped_storage())
    for view, kind in ((tma.rows_view, "rows"), (tma.kv_view, "kv")):
        w = view(_bhsd_as(t, layout), layout)
        if w is None:
            continue
        assert torch.equal(_through(t, w, kind), t), (kind, t.stride(), w)
        shape, strides = tma.exact(_bhsd_as(t, layout), w, layout)
        base = torch.as_strided(storage, shape, strides, t.storage_offset())  # raises past the storage
        for i in range(t.shape[0]):
            for j in range(t.shape[1]):
                at, first = j if w.col else 0, i * w.batch + j * w.head
                got = base[at, first:first + t.shape[2]] if kind == "rows" else base[at, first, :t.shape[2]]
                assert torch.equal(got, t[i, j]), (kind, t.stride(), w)


def test_a_page_pool_reads_as_bshd():
    pool = torch.randn(3, 64, 2, 128, dtype=torch.bfloat16)  # [pages, page, kv_heads, D]
    w = tma.kv_view(pool, "bshd")
    assert torch.equal(_through(pool.transpose(1, 2), w, "kv"), pool.transpose(1, 2))


def test_decode_keys_of_a_concatenated_cache_read_as_bshd_views():
    """transformers' cache after a decode step: bhsd storage, handed over as a bshd view."""
    k = torch.randn(2, 4, 33, 64, dtype=torch.float16)
    w = tma.kv_view(k.transpose(1, 2), "bshd")
    assert torch.equal(_through(k, w, "kv"), k)


@pytest.mark.parametrize("case", ["last dim strided", "misaligned pointer", "misaligned row stride",
                                  "misaligned head stride", "heads interleaved within d"])
def test_views_refuse_what_tma_cannot_read(case):
    x = torch.randn(2, 4, 32, 128, dtype=torch.float16)
    if case == "last dim strided":
        t = x[..., ::2]
    elif case == "misaligned pointer":
        t = x[..., 1:65]  # 2 bytes past a 16-byte boundary
    elif case == "misaligned row stride":
        t = torch.randn(2, 4, 32, 68, dtype=torch.float16)[..., :64]  # 136-byte rows
    elif case == "misaligned head stride":  # heads side by side 136 bytes apart: head 1's box starts off 16 bytes
        t = torch.randn(2, 32, 4, 68, dtype=torch.float16)[..., :64].transpose(1, 2)
    else:  # two heads' dims interleaved: head h at column h, stride 2 between a head's columns is not TMA's
        t = torch.randn(2, 32, 64, 4, dtype=torch.float16).permute(0, 3, 1, 2)
    assert tma.rows_view(t, "bhsd") is None and tma.kv_view(t, "bhsd") is None
    assert "TMA" in tma.reason((t, t, t, t), "bhsd")


def test_k_and_v_must_place_heads_alike():
    k = torch.randn(1, 4, 64, 64, dtype=torch.float16)
    v = torch.randn(1, 64, 4, 64, dtype=torch.float16).transpose(1, 2)
    assert "differently" in tma.kv_reason(k, v, "bhsd")
    # bshd K and V of head dims 192 and 128: heads side by side at different column strides; one leading
    # index each through the exact descriptors
    k, v = torch.randn(1, 64, 4, 192, dtype=torch.float16), torch.randn(1, 64, 4, 128, dtype=torch.float16)
    assert "differently" in tma.kv_reason(k, v, "bshd") and tma.kv_reason(k, v, "bshd", exact=True) is None


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("d,dv", [(96, 96), (192, 128), (32, 32)])
def test_hopper_descriptors_end_at_each_head_dim(layout, d, dv):
    """The Gluon kernel's four descriptors: Q/O 3-D with 64-row boxes, K/V 4-D with key-tile boxes, each box
    as wide as its head dim's tile (a power of two) over a last dimension of exactly q/k's or v's head dim."""
    from fmha import configs
    from fmha.kernels import hopper
    from fmha.plan import Problem
    prob = Problem(2, 4, 2, 100, 100, d, True, 0, 1.0, head_dim_v=dv if dv != d else 0)
    cfg = configs.hopper_config(d, True, 100)

    def t(heads, dim):
        shape = (2, heads, 100, dim) if layout == "bhsd" else (2, 100, heads, dim)
        return torch.empty(shape, dtype=torch.bfloat16)
    descs, place = hopper.descriptors(prob, cfg, t(4, d), t(2, d), t(2, dv), t(4, dv), layout)
    assert [len(x.shape) for x in descs] == [3, 4, 4, 3]
    assert [x.shape[-1] for x in descs] == [d, d, dv, dv]
    assert [x.block_shape for x in descs] == [[1, 64, hopper.padded(d)], [1, 1, cfg.block_n, hopper.padded(d)],
                                              [1, 1, cfg.block_n, hopper.padded(dv)], [1, 64, hopper.padded(dv)]]
    side = layout == "bshd"  # heads side by side in a row: a leading index of their own
    assert [x.shape[0] for x in descs] == ([4, 2, 2, 4] if side else [1, 1, 1, 1])
    assert (place[2], place[5]) == (int(side), int(side))
