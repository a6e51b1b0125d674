"""The recorded call path (:mod:`fmha.replay`) with stand-in kernels on the host: a replay passes the new
call's tensors where the recorded call's were, allocates its own buffers, rebuilds descriptors over
the new pointers, keeps nothing of the recorded call alive, and refuses to record what it could not
replay correctly.  The GPU tests run it on the real kernels."""
import functools
import gc
import threading
import weakref
from dataclasses import dataclass

import pytest
import torch

from fmha import launcher, replay


@dataclass
class Desc:  # a TMA descriptor: a base tensor, the view over it, a box
    base: object
    block_shape: list
    shape: tuple = (4,)
    strides: tuple = (1,)
    padding: str = "zero"


class Param:
    def __init__(self, default):
        self.default = default


class FakeKernel:
    """``kernel[grid](*args, **kw)`` returning a compiled stand-in whose launcher logs its arguments."""

    arg_names = ["X", "Y", "D", "n", "BLOCK"]
    params = [Param(None)] * 4 + [Param(16)]

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def run(*args, **kw):
            full = list(args) + [kw.get("BLOCK", 16)]
            self.launches.append(("jit", grid, full))
            return self
        return run

    @property
    def run(self):
        return lambda gx, gy, gz, stream, fn, meta, lm, enter, exit_, *args: self.launches.append(
            ("direct", (gx, gy, gz), list(args)))

    function = packed_metadata = None

    def launch_metadata(self, grid, stream, *args):
        return None


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    replay.clear()
    monkeypatch.setattr(replay, "_stream", lambda device: 0)
    yield
    replay.clear()


def _call(kernel, x, y):
    """A call of one kind: allocates an output, launches over x (a view of it), y's descriptor, the output."""
    out = replay.buffer(torch.empty(4))
    replay.launch(kernel, (2,), x[None], out, Desc(y, [8]), 7, BLOCK=32)
    return out, None


def _kind(x, y):
    return replay.key("fake", (x, y), "flag")


def test_a_replay_launches_over_the_new_tensors():
    kernel = FakeKernel()
    x, y = torch.zeros(4), torch.ones(4)
    out1, _ = replay.call(_kind(x, y), (x, y), torch.device("cpu"), lambda: _call(kernel, x, y))
    x2, y2 = torch.zeros(4), torch.ones(4)
    out2, lse = replay.call(_kind(x2, y2), (x2, y2), torch.device("cpu"), lambda: pytest.fail("not replayed"))
    (how1, grid1, a1), (how2, grid2, a2) = kernel.launches
    assert (how1, how2) == ("jit", "direct") and grid2 == (2, 1, 1)
    d = a2[2]
    assert a2[0] is x2 and d.base is y2 and (d.shape, d.strides, d.padding) == ((4,), (1,), "zero")
    assert a2[3:] == [7, 32]
    assert a2[1] is out2 and out2 is not out1 and out2.shape == out1.shape and lse is None


def _record_once(kernel):
    x, y = torch.zeros(4), torch.ones(4)
    kind = _kind(x, y)
    out, _ = replay.call(kind, (x, y), torch.device("cpu"), lambda: _call(kernel, x, y))
    return kind, [weakref.ref(t) for t in (x, y, out)]


def test_a_recipe_keeps_nothing_of_the_recorded_call():
    kernel = FakeKernel()
    kind, refs = _record_once(kernel)
    kernel.launches.clear()
    gc.collect()
    assert all(r() is None for r in refs)
    assert kind in replay._RECIPES


def test_what_cannot_be_replayed_is_not_recorded():
    kernel = FakeKernel()
    x, y = torch.zeros(4), torch.ones(4)
    dev = torch.device("cpu")
    replay.call(_kind(x, y), (x, y), dev, lambda: (torch.empty(4), None))  # an edge answered without a launch
    assert not replay._RECIPES

    def stranger():  # a tensor that is neither an input, a buffer nor a constant
        replay.launch(kernel, (1,), x, torch.ones(4), Desc(y, [8]), 7)
        return x, None
    kind = replay.key("other", (x, y))
    replay.call(kind, (x, y), dev, stranger)
    assert replay._RECIPES[kind] is replay.UNRECORDABLE
    n = len(kernel.launches)
    replay.call(kind, (x, y), dev, stranger)  # the ordinary path again
    assert kernel.launches[n][0] == "jit"


def test_inputs_passed_twice_replay_as_a_kind_of_their_own():
    """The same tensor in two places (cu_seqlens_q is cu_seqlens_k, as self-attention passes them): the key
    says so, a later call sharing its tensors alike replays, one passing two distinct tensors is another kind."""
    kernel = FakeKernel()
    dev = torch.device("cpu")
    x = torch.zeros(4)
    replay.call(_kind(x, x), (x, x), dev, lambda: _call(kernel, x, x))
    assert _kind(x, x) in replay._RECIPES and _kind(x, x) != _kind(x, torch.zeros(4))
    x2 = torch.zeros(4)
    out, _ = replay.call(_kind(x2, x2), (x2, x2), dev, lambda: pytest.fail("not replayed"))
    how, _, args = kernel.launches[-1]
    assert how == "direct" and args[0] is x2 and args[2].base is x2 and args[1] is out
    y, z = torch.zeros(4), torch.ones(4)
    replay.call(_kind(y, z), (y, z), dev, lambda: _call(kernel, y, z))
    assert kernel.launches[-1][0] == "jit"


def test_constants_are_passed_as_they_are():
    kernel = FakeKernel()
    x, y = torch.zeros(4), torch.ones(4)
    work = torch.arange(3)

    def with_work():
        replay.launch(kernel, (1,), x, replay.constant(work), Desc(y, [8]), 1)
        return x, None
    replay.call(replay.key("w", (x, y)), (x, y), torch.device("cpu"), with_work)
    x2, y2 = torch.zeros(4), torch.ones(4)
    replay.call(replay.key("w", (x2, y2)), (x2, y2), torch.device("cpu"), with_work)
    assert kernel.launches[-1][2][1] is work and kernel.launches[-1][2][0] is x2


_SENT: dict = {}  # function handle -> the stand-in kernel whose plans the stand-in launcher decodes


def _send(plan, stream, *args):
    """The C launcher's stand-in: decodes a plan (:mod:`fmha.launcher`) into the kernel's parameters, each slot's
    value or the argument it names, and logs them on the kernel (the two scratch pointers checked and dropped)."""
    function, gx, gy, gz, threads, shared, ctas, coop, pdl, n, pointers, descriptors, _ = launcher.HEADER.unpack_from(
        plan)
    assert len(plan) == launcher.HEADER.size + n * launcher.SLOT.size and len(args) == pointers + descriptors
    assert all(isinstance(a, int) for a in args[:pointers])
    params = []
    for k in range(n):
        source, _, value = launcher.SLOT.unpack_from(plan, launcher.HEADER.size + k * launcher.SLOT.size)
        params.append(value if source < 0 else args[source])
    assert params[-2:] == [0, 0]
    _SENT[function].launches.append(("raw", (gx, gy, gz), params[:-2]))


class RawKernel(FakeKernel):
    """A compiled stand-in with Triton's CUDA launcher's shape: its signature (one descriptor lowered to a
    CUtensorMap), no scratch memory, its launches sent from plans (decoded by :func:`_send`)."""

    class metadata:
        tensordesc_meta = [dict(swizzle=3, elem_size=2, elem_type=8, block_size=[8], fp4_padded=False)]

    class src:
        signature = {"X": "*fp32", "Y": "*fp32", "D": "tensordesc<fp32[8]>", "n": "i32", "BLOCK": "constexpr"}
    packed_metadata = (4, 1, 0)

    def __init__(self):
        super().__init__()
        self.function = id(self)
        _SENT[self.function] = self

    @functools.cached_property  # (one launcher a compiled kernel, as Triton's)
    def run(self):
        kernel = self

        def through_triton(self, gx, gy, gz, stream, fn, meta, lm, enter, exit_, *args):
            kernel.launches.append(("direct", (gx, gy, gz), list(args)))
        return type("Launcher", (), dict(global_scratch_size=0, profile_scratch_size=0, launch_cooperative_grid=False,
                                         launch_pdl=False, __call__=through_triton))()


@pytest.fixture(autouse=True)
def stand_in_launcher(monkeypatch):
    monkeypatch.setattr(launcher, "sender", lambda: _send)


def test_without_hooks_a_replay_drives_the_raw_launcher(monkeypatch):
    """Pointers as integers (a buffer the call does not return in one scratch block), the descriptor filled
    over the new base (once per base), shape and strides after it; an installed launch hook takes Triton's
    path (where Triton calls it)."""
    fills = []
    monkeypatch.setattr(replay, "_fill_descriptor", lambda ptr, *fill: fills.append((ptr, fill)) or ("map", ptr))
    kernel = RawKernel()
    x, y = torch.zeros(4), torch.ones(4)

    def with_partials():  # a buffer the call does not return: the replay's one scratch block holds it
        out, _ = _call(kernel, x, y)
        replay.launch(kernel, (1,), x, replay.buffer(torch.empty(3)), Desc(y, [8]), 5)
        return out, None
    replay.call(_kind(x, y), (x, y), torch.device("cpu"), with_partials)
    x2, y2 = torch.zeros(4), torch.ones(4)
    for _ in range(2):
        out, _ = replay.call(_kind(x2, y2), (x2, y2), torch.device("cpu"), lambda: pytest.fail("not replayed"))
    (how, grid, args), (_, _, partial_args) = kernel.launches[-2:]
    assert how == "raw" and grid == (2, 1, 1)
    assert args == [x2.data_ptr(), out.data_ptr(), ("map", y2.data_ptr()), 4, 1, 7]  # (BLOCK: a constexpr)
    assert isinstance(partial_args[1], int) and partial_args[1] not in (out.data_ptr(), x2.data_ptr())
    assert [f[0] for f in fills] == [y2.data_ptr()] * 2  # one a launch, not one a replay
    assert fills[0][1] == (3, 2, 10, [8], [4], [1], 0)
    monkeypatch.setattr(replay.knobs.runtime, "launch_enter_hook", replay.knobs.HookChain())
    replay.knobs.runtime.launch_enter_hook.add(lambda meta: None)
    replay.call(_kind(x2, y2), (x2, y2), torch.device("cpu"), lambda: pytest.fail("not replayed"))
    assert kernel.launches[-1][0] == "direct"


def test_an_entry_point_replays_a_kind_the_table_holds(monkeypatch):
    """:func:`replay.replayed` makes the key :func:`replay.through` makes on a GPU (the flags, then whether the call
    may hold buffers) and replays the recipe it finds; a kind the table does not hold answers None, launching
    nothing."""
    monkeypatch.setattr(replay, "_fill_descriptor", lambda ptr, *fill: ("map", ptr))
    kernel = RawKernel()
    x, y = torch.zeros(4), torch.ones(4)
    cpu = torch.device("cpu")
    replay.call(replay.key("w", (x, y), "flag", True), (x, y), cpu, lambda: _call(kernel, x, y))
    x2, y2 = torch.zeros(4), torch.ones(4)
    out, _ = replay.replayed("w", (x2, y2), "flag")
    assert kernel.launches[-1] == ("raw", (2, 1, 1), [x2.data_ptr(), out.data_ptr(), ("map", y2.data_ptr()), 4, 1, 7])
    launched = len(kernel.launches)
    assert replay.replayed("w", (x2, y2), "other flag") is None
    assert replay.replayed("w", (x2, torch.ones(5)), "flag") is None
    assert len(kernel.launches) == launched
    grow = GrowKernel()  # a length its family knows (asked of ``lengths`` on the table's miss alone)
    _lengths(grow, [33, 34, 35, 37], ahead=[])
    x, y = torch.zeros(38, 4), torch.ones(2, 38)
    asked = []
    out, _ = replay.replayed("grow", (x, y), "flag", lengths=lambda: asked.append(1) or ({0: 0, 1: 1}, 38))
    assert grow.launches[-1] == ("raw", (2, 1, 1), [x.data_ptr(), out.data_ptr(), ("map", y.data_ptr()), 2, 38,
                                                    38, 1, 38, 7])
    assert replay.replayed("grow", (x, y), "flag", lengths=lambda: asked.append(1)) is not None and asked == [1]
    x, y = torch.zeros(48, 4), torch.ones(2, 48)  # divisible by 16: no line of another compiled kernel yet
    assert replay.replayed("grow", (x, y), "flag", lengths=lambda: ({0: 0, 1: 1}, 48)) is None


def test_a_new_thread_starts_outside_any_recording(monkeypatch):
    """A thread's state starts empty (nothing being recorded, not transient, no workspace): a kind recorded in one
    thread replays in another, and a kind first met there is recorded there, its scratch in that thread's own
    workspace."""
    monkeypatch.setattr(replay, "_fill_descriptor", lambda ptr, *fill: ("map", ptr))
    kernel = RawKernel()
    x, y = torch.zeros(4), torch.ones(4)
    replay.call(_kind(x, y), (x, y), torch.device("cpu"), lambda: _call(kernel, x, y))
    seen, spaces = [], []

    def other():
        seen.append((replay._local.steps, replay._local.call, replay._local.transient, replay._local.workspaces))
        x2, y2 = torch.zeros(4), torch.ones(4)
        replay.call(_kind(x2, y2), (x2, y2), torch.device("cpu"), lambda: seen.append("not replayed"))
        seen.append(kernel.launches[-1][0])

        def with_partials():
            replay.launch(kernel, (1,), x2, replay.buffer(torch.empty(3)), Desc(y2, [8]), 5)
            return x2, None
        for _ in range(2):
            replay.call(replay.key("other", (x2, y2)), (x2, y2), torch.device("cpu"), with_partials)
        seen.append((kernel.launches[-1][0], list(replay._local.workspaces)))
        spaces.append(replay._local.workspaces)
    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == [(None, None, False, None), "raw", ("raw", [(None, 0)])]
    assert spaces[0] is not replay._local.workspaces


def test_a_replay_counts_in_the_tickets_of_the_stream_it_launches_on(monkeypatch):
    """A launch's counters (a split that merges its own partials) are the launching stream's block, at zero:
    never the recorded call's block replayed on another stream, never the scratch."""
    monkeypatch.setattr(replay, "_fill_descriptor", lambda ptr, *fill: ("map", ptr))
    monkeypatch.setattr(replay, "_TICKETS", {})
    stream = [0]
    monkeypatch.setattr(replay, "_stream", lambda device: stream[0])
    kernel = RawKernel()
    x, y = torch.zeros(4), torch.ones(4)
    cpu = torch.device("cpu")

    def counting():
        out, _ = _call(kernel, x, y)
        replay.launch(kernel, (1,), x, replay.buffer(torch.empty(3)), replay.tickets(cpu, 6), Desc(y, [8]), 5)
        return out, None
    replay.call(_kind(x, y), (x, y), cpu, counting)
    recorded = replay._TICKETS[(cpu, 0)]
    seen = []
    for s in (0, 7, 0):
        stream[0] = s
        replay.call(_kind(x, y), (x, y), cpu, lambda: pytest.fail("not replayed"))
        seen.append(kernel.launches[-1][2][2])
        assert seen[-1] != kernel.launches[-1][2][1]  # not the scratch
    other = replay._TICKETS[(cpu, 7)]
    assert seen == [recorded.data_ptr(), other.data_ptr(), recorded.data_ptr()]
    assert other.numel() >= 6 and not other.any() and other.data_ptr() != recorded.data_ptr()


def test_the_key_tells_layouts_and_alignment_apart():
    x = torch.zeros(2, 3, 8)
    assert replay.key("k", (x,)) == replay.key("k", (torch.ones(2, 3, 8),))
    assert replay.key("k", (x,)) != replay.key("k", (x.transpose(0, 1).contiguous().transpose(0, 1),))
    assert replay.key("k", (x,)) != replay.key("k", (torch.zeros(2 * 3 * 8 + 1)[1:].view(2, 3, 8),))
    assert replay.key("k", (x,)) != replay.key("k", (x.half(),))


def test_a_replay_keeps_its_scratch_in_the_threads_workspace(monkeypatch):
    """The buffers a call does not return lie in one workspace per thread and stream, reused by every replay
    and grown when a call needs more (up to a bound); never an input's or the returned output's memory."""
    kernel = RawKernel()
    monkeypatch.setattr(replay, "_fill_descriptor", lambda ptr, *fill: ("map", ptr))
    monkeypatch.setattr(replay._local, "workspaces", {})

    def with_partials(a, n):
        def call():
            out, _ = _call(kernel, a, y)
            replay.launch(kernel, (1,), a, replay.buffer(torch.empty(n)), Desc(y, [8]), 5)
            return out, None
        return call
    x, y = torch.zeros(4), torch.ones(4)
    replay.call(_kind(x, y), (x, y), torch.device("cpu"), with_partials(x, 3))
    seen = []
    for _ in range(2):
        out, _ = replay.call(_kind(x, y), (x, y), torch.device("cpu"), lambda: pytest.fail("not replayed"))
        seen.append(kernel.launches[-1][2][1])
        assert seen[-1] not in (out.data_ptr(), x.data_ptr(), y.data_ptr())
    assert seen[0] == seen[1]
    big = torch.zeros(64)
    replay.call(replay.key("big", (big, y)), (big, y), torch.device("cpu"), with_partials(big, 1000))
    replay.call(replay.key("big", (big, y)), (big, y), torch.device("cpu"), lambda: pytest.fail("not replayed"))
    block = replay._local.workspaces[(None, 0)]
    assert block.numel() >= 4000 and kernel.launches[-1][2][1] == block.data_ptr()
    with replay.transient():  # a call that may hold nothing (a custom op's): a block of its own, not kept
        replay.call(replay.key("big", (big, y)), (big, y), torch.device("cpu"), lambda: pytest.fail("not replayed"))
    assert replay._local.workspaces[(None, 0)] is block and kernel.launches[-1][2][1] != block.data_ptr()
    monkeypatch.setattr(replay, "WORKSPACE_BYTES", 1024)  # past the bound: a block of the call's own, not kept
    replay.call(replay.key("big", (big, y)), (big, y), torch.device("cpu"), lambda: pytest.fail("not replayed"))
    assert replay._local.workspaces[(None, 0)] is block and kernel.launches[-1][2][1] != block.data_ptr()


def test_a_replay_told_whether_it_may_hold_asks_no_more(monkeypatch):
    """The entry point asks once whether a call may keep buffers past its end (on a GPU a query of the stream's
    capture state, which costs microseconds) and passes the answer down: the replay then takes the thread's
    workspace, or, told it may hold nothing, a block of its own, without asking again."""
    kernel = RawKernel()
    monkeypatch.setattr(replay, "_fill_descriptor", lambda ptr, *fill: ("map", ptr))
    monkeypatch.setattr(replay._local, "workspaces", {})
    x, y = torch.zeros(4), torch.ones(4)
    cpu = torch.device("cpu")

    def with_partials():
        out, _ = _call(kernel, x, y)
        replay.launch(kernel, (1,), x, replay.buffer(torch.empty(3)), Desc(y, [8]), 5)
        return out, None
    replay.call(_kind(x, y), (x, y), cpu, with_partials)
    monkeypatch.setattr(replay, "holding", lambda device: pytest.fail("asked again"))
    replay.call(_kind(x, y), (x, y), cpu, lambda: pytest.fail("not replayed"), held=True)
    block = replay._local.workspaces[(None, 0)]
    assert kernel.launches[-1][2][1] == block.data_ptr()
    replay.call(_kind(x, y), (x, y), cpu, lambda: pytest.fail("not replayed"), held=False)
    assert kernel.launches[-1][2][1] != block.data_ptr() and replay._local.workspaces[(None, 0)] is block


def test_the_default_stream_is_never_asked_whether_it_is_captured(monkeypatch):
    """CUDA refuses to capture the legacy default stream (0), where an eager program runs: a call there may hold
    its buffers without the capture query; on any other stream the query decides, and inside :func:`transient`
    nothing is held."""
    cuda = torch.device("cuda", 0)
    capturing = []
    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: capturing.append(1) or True,
                        raising=False)
    assert replay.holding(cuda, 0) and not capturing
    assert not replay.holding(cuda, 7) and capturing == [1]
    assert not replay.holding(cuda) and capturing == [1, 1]
    with replay.transient():
        assert not replay.holding(cuda, 0)


def test_descriptors_are_filled_once_for_each_base(monkeypatch):
    """A launch's descriptor slot keeps what it filled for each base pointer it meets: calls taking turns over
    two tensors (one recipe shared by a model's layers, each with its own KV cache) fill each one once."""
    fills = []
    monkeypatch.setattr(replay, "_fill_descriptor", lambda ptr, *fill: fills.append(ptr) or ("map", ptr))
    kernel = RawKernel()
    x, y = torch.zeros(4), torch.ones(4)
    replay.call(_kind(x, y), (x, y), torch.device("cpu"), lambda: _call(kernel, x, y))
    bases = [torch.ones(4), torch.ones(4)]
    for turn in range(6):
        y_now = bases[turn % 2]
        replay.call(_kind(x, y_now), (x, y_now), torch.device("cpu"), lambda: pytest.fail("not replayed"))
        assert kernel.launches[-1][2][2] == ("map", y_now.data_ptr())
    assert sorted(fills) == sorted(b.data_ptr() for b in bases)


def test_a_call_that_writes_besides_its_launches_is_not_replayed():
    """A check's launch, then the outputs written on the host side (an empty paged cache: zeros): a replay
    would make the launch alone and return an output never written, so every call takes the ordinary path."""
    kernel = FakeKernel()
    x, y = torch.zeros(4), torch.ones(4)
    kind = _kind(x, y)

    def edge():
        out = replay.buffer(torch.empty(4))
        replay.launch(kernel, (1,), x, out, Desc(y, [8]), 7)
        replay.host_work()
        return out.zero_(), None
    for _ in range(2):
        out, _ = replay.call(kind, (x, y), torch.device("cpu"), edge)
        assert torch.equal(out, torch.zeros(4))
    assert replay._RECIPES[kind] is replay.UNRECORDABLE and [how for how, *_ in kernel.launches] == ["jit", "jit"]



def _jit_kernel():
    """A real (not interpreted) JIT function, its backend set by hand (no driver on the host)."""
    import triton.language as tl
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import JITFunction

    def kernel(X, Y, n, m, BLOCK: tl.constexpr):
        pass
    jit = JITFunction(kernel)
    jit.device_caches[0] = ({}, {}, None, BaseBackend, None)
    return jit


def test_a_launch_like_a_compiled_one_goes_to_that_kernel(monkeypatch):
    """:func:`replay._dispatch`: an earlier launch's compiled kernel takes a launch whose positional arguments
    specialize alike (integers: 1, divisible by 16 or neither; tensors: dtype, 16-byte alignment) under the same
    keyword arguments, with every argument in the signature's order; any other launch goes to Triton's JIT.
    What is kept of the earlier launch holds none of its tensors; a kernel's constexprs and options keep their
    latest compiled forms apart from other constexprs'."""
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 5, raising=False)
    runs = []
    compiled = type("Compiled", (), dict(function="fn", packed_metadata="meta",
                                         run=staticmethod(lambda *a: runs.append(a))))()
    kernel, kw = _jit_kernel(), dict(BLOCK=16, num_warps=4)
    x, y = torch.zeros(8), torch.zeros(8, dtype=torch.int32)
    replay._remember(kernel, compiled, (x, y, 32, 7), kw)
    dead = weakref.ref(x)
    del x
    gc.collect()
    assert dead() is None
    x2, y2 = torch.ones(8), torch.ones(8, dtype=torch.int32)
    assert replay._dispatch(kernel, (3, 2), (x2, y2, 48, 9), kw) is compiled
    grid, stream, full = runs[-1][:3], runs[-1][3], runs[-1][9:]
    assert grid == (3, 2, 1) and stream == 5 and runs[-1][4:6] == ("fn", "meta")
    assert full == (x2, y2, 48, 9, 16) and runs[-1][6] is None
    for args in ((x2, y2, 40, 9), (x2, y2, 48, 1), (x2, y2, 48, 2 ** 40), (torch.zeros(9)[1:], y2, 48, 9),
                 (x2.double(), y2, 48, 9)):
        assert replay._dispatch(kernel, (1,), args, kw) is None, args
    for changed in (dict(BLOCK=32, num_warps=4), dict(BLOCK=16, num_warps=8)):  # a constexpr, an option
        assert replay._dispatch(kernel, (1,), (x2, y2, 48, 9), changed) is None
    assert replay._dispatch(kernel, (1,), (x2, y2), dict(kw, n=48, m=9)) is compiled  # by name alike
    assert runs[-1][9:] == full
    # a key keeps its latest compiled forms (a growing length's two), and each constexpr set its own
    other, wide = (type("Compiled", (), dict(function=f, packed_metadata="meta", run=staticmethod(lambda *a: None)))()
                   for f in ("other", "wide"))
    replay._remember(kernel, other, (x2, y2, 33, 7), kw)
    replay._remember(kernel, wide, (x2, y2, 32, 7), dict(kw, BLOCK=32))
    assert replay._dispatch(kernel, (1,), (x2, y2, 48, 9), kw) is compiled
    assert replay._dispatch(kernel, (1,), (x2, y2, 49, 9), kw) is other
    assert replay._dispatch(kernel, (1,), (x2, y2, 64, 9), dict(kw, BLOCK=32)) is wide
    monkeypatch.setattr(replay.knobs.runtime, "launch_enter_hook", replay.knobs.HookChain())
    replay.knobs.runtime.launch_enter_hook.add(lambda meta: None)
    assert replay._dispatch(kernel, (1,), (x2, y2, 48, 9), kw) is None  # a hook listens: Triton's path
    assert len(runs) == 3


class GrowKernel(RawKernel):
    arg_names = ["X", "Y", "D", "n", "m", "BLOCK"]
    params = [Param(None)] * 5 + [Param(16)]

    class src:
        signature = {"X": "*fp32", "Y": "*fp32", "D": "tensordesc<fp32[8, 8]>", "n": "i32", "m": "i32",
                     "BLOCK": "constexpr"}


def _growing(kernel, x, y, n, bump=lambda n: 0, outcome=lambda n: 3, planned=None, ahead=None):
    """A decode-like call at length ``n``: x ``[n, 4]`` and y ``[2, n]`` (the length along x's rows and y's
    columns), a launch taking n, y's descriptor (shape and strides in n) and ``7 + bump(n)``; its plan (noted in
    ``planned``) decides ``outcome(n)``; ``ahead``, a list, notes the lengths the family asks the plan about."""
    def plan_at(m):
        ahead.append(m)
        return "split", outcome(m)

    def call():
        if planned is not None:
            planned.append(n)
        replayed = replay.lengthwise(("split", outcome(n)), plan_at if ahead is not None else None)
        if replayed is not None:
            return tuple(replayed)
        out = replay.buffer(torch.empty(4))
        replay.launch(kernel, (2,), x, out, Desc(y, [8], shape=(2, n), strides=(n, 1)), n, 7 + bump(n), BLOCK=32)
        return out, None
    return replay.call(replay.key("grow", (x, y), "flag", True), (x, y), torch.device("cpu"), call,
                       lengths=({0: 0, 1: 1}, n))  # (the key :func:`replay.replayed` makes: whether the call holds)


def _lengths(kernel, lengths, bump=lambda n: 0, outcome=lambda n: 3, planned=None, ahead=None):
    """Calls at each length in turn, fresh tensors each; how each call's launch went."""
    hows = []
    for n in lengths:
        x, y = torch.zeros(n, 4), torch.ones(2, n)
        out, _ = _growing(kernel, x, y, n, bump, outcome, planned, ahead)
        hows.append(kernel.launches[-1][0])
        written = kernel.launches[-1][2][1]
        assert written is out if hows[-1] == "jit" else written == out.data_ptr()
    return hows


def test_a_call_knows_whether_its_cache_grows(monkeypatch):
    """:func:`replay.growing` inside a recorded call: false for the first length of a kind (a cache that stays) and
    outside any call; true once the kind was met at another length, also for the other side of a graph's capture
    (a key's last part, whether the call holds), so a capture plans as its eager warm-up did; never for a kind of
    other flags."""
    monkeypatch.setattr(replay, "_fill_descriptor", lambda ptr, *fill: ("map", ptr, *fill))
    kernel, seen = GrowKernel(), []

    def at(n, held=True, flag="flag"):
        x, y = torch.zeros(n, 4), torch.ones(2, n)

        def call():
            seen.append(replay.growing())
            assert replay.lengthwise(("split", 3)) is None  # (the family learns the length; two prove nothing)
            out = replay.buffer(torch.empty(4))
            replay.launch(kernel, (2,), x, out, Desc(y, [8], shape=(2, n), strides=(n, 1)), n, 7, BLOCK=32)
            return out, None
        replay.call(replay.key("grow", (x, y), flag, held), (x, y), torch.device("cpu"), call,
                    lengths=({0: 0, 1: 1}, n), held=held)
    assert not replay.growing()
    at(33)
    at(34)
    at(33, flag="other")
    at(40, held=False)
    assert seen == [False, True, False, True]


def test_a_growing_length_replays_from_its_family(monkeypatch):
    """A KV cache one key longer at each call (every call a new kind): two recordings of the same compiled kernel
    at two lengths give each integer's line, a third must match them, then each later length of the family
    launches from the lines (the raw launcher, the descriptor filled over the new length's shape and strides)
    without the call's own path; a length whose integers would specialize otherwise (n divisible by 16) is
    recorded as before.  A recipe made from the lines is kept under its call's key, as any recipe is."""
    monkeypatch.setattr(replay, "_fill_descriptor", lambda ptr, *fill: ("map", ptr, *fill))
    kernel = GrowKernel()
    assert _lengths(kernel, [33, 34, 35, 37, 41, 48, 50]) == ["jit", "jit", "jit", "raw", "raw", "jit", "raw"]
    x, y = torch.zeros(41, 4), torch.ones(2, 41)
    out, _ = _growing(kernel, x, y, 41)  # (its key kept: a plain replay)
    _, _, args = kernel.launches[-1]
    filled = ("map", y.data_ptr(), 3, 2, 10, [8], [2, 41], [41, 1], 0)
    assert args == [x.data_ptr(), out.data_ptr(), filled, 2, 41, 41, 1, 41, 7]


class SpecKernel(GrowKernel):
    """A growing launch whose length divisible by 16 runs another compiled kernel, as Triton's specialization of
    integer arguments picks one (both log their launches here)."""

    def __init__(self):
        super().__init__()
        self.wide = GrowKernel()
        self.wide.launches = self.launches

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.launches.append(("jit", grid, list(args) + [kw.get("BLOCK", 16)]))
            return self.wide if args[3] % 16 == 0 else self
        return run


def test_a_length_reads_its_integers_specializations_as_evaluating_each_would():
    """:meth:`_Length.specializes`, which evaluates no integer where only their divisibility by 16 can move, agrees
    with evaluating each integer's specialization: lines through 1, across the 32-bit bounds, falling, flat."""
    lines = [(0, 1), (3, 16), (-(1 << 31) + 5, 1), ((1 << 31) - 50, 1), (100, -1), (5, -32), (1, 0), (7, 64),
             (-2, 3), (0, 1 << 28), (1 << 40, -(1 << 33))]
    for n0 in (1, 2, 8, 33, 48, 60, 97, 130):
        for a, b in lines:
            ints = [(0, a, b, replay._specialized(a + b * n0)), (1, 0, 1, replay._specialized(n0))]
            length = replay._Length(None, [(ints, [])], n0)
            for n in range(-10, 300):
                want = all(replay._specialized(x + y * n) == spec for _, x, y, spec in ints)
                assert length.specializes(n) == want, (a, b, n0, n)


def test_a_trusted_family_takes_another_compiled_kernel_from_one_recording(monkeypatch):
    """Lines proven on one compiled kernel hold for the other that lengths divisible by 16 run: one recording of
    the other kernel, launching what the lines give there, makes them replay its lengths (their launches sent to
    that kernel); a recording the lines do not give is no line of the family."""
    monkeypatch.setattr(replay, "_fill_descriptor", lambda ptr, *fill: ("map", ptr, *fill))
    kernel = SpecKernel()
    assert _lengths(kernel, [33, 34, 35, 37, 48, 50, 64, 80, 81]) == ["jit"] * 3 + ["raw", "jit"] + ["raw"] * 4
    sent = [fn for fn in _SENT if _SENT[fn] in (kernel, kernel.wide)]
    x, y = torch.zeros(96, 4), torch.ones(2, 96)
    out, _ = _growing(kernel, x, y, 96)
    how, _, args = kernel.launches[-1]
    filled = ("map", y.data_ptr(), 3, 2, 10, [8], [2, 96], [96, 1], 0)
    assert how == "raw" and args == [x.data_ptr(), out.data_ptr(), filled, 2, 96, 96, 1, 96, 7]
    assert len(sent) == 2
    replay.clear()
    kernel = SpecKernel()  # the other kernel's recording off the lines (a step at 48): not taken
    step = lambda n: 100 if n >= 48 else 0  # noqa: E731
    assert _lengths(kernel, [33, 34, 35, 37, 48, 64], step) == ["jit"] * 3 + ["raw", "jit", "jit"]


def test_a_family_leaves_its_latest_lengths_in_the_table(monkeypatch):
    """A cache one key longer at each call makes a recipe a length: the family leaves only its latest
    :data:`KEPT_LENGTHS` in the replay table (a call at one of them replays it without the family), so the table
    neither grows a recipe a token nor starts again and drops every other kind's."""
    monkeypatch.setattr(replay, "_fill_descriptor", lambda ptr, *fill: ("map", ptr))
    kernel = GrowKernel()
    kept = replay._Family.KEPT_LENGTHS
    lengths = [n for n in range(33, 33 + 3 * kept) if n % 16]
    assert _lengths(kernel, lengths)[3:] == ["raw"] * (len(lengths) - 3)
    made = [r for r in replay._RECIPES.values() if r is not replay.UNRECORDABLE and r.steps is None]
    assert len(made) == kept and len(replay._RECIPES) == kept + 3  # (and the three recordings)
    at = []
    monkeypatch.setattr(replay, "_known_length", lambda *a: at.append(a) or None)
    _lengths(kernel, lengths[-kept:])
    assert not at


def test_a_line_the_third_recording_breaks_replays_nothing(monkeypatch):
    """Integers on lines through two lengths but off them at a third (a step the family's key does not see)
    are not trusted: every length keeps the ordinary path, until lines through two later recordings hold."""
    monkeypatch.setattr(replay, "_fill_descriptor", lambda ptr, *fill: ("map", ptr))
    kernel = GrowKernel()
    step = lambda n: 100 if n >= 36 else 0  # noqa: E731
    assert _lengths(kernel, [33, 34, 36, 37, 38], step) == ["jit"] * 5
    assert _lengths(kernel, [39, 41], step) == ["raw", "raw"]  # lines through 37 and 38, proven at 39
    x, y = torch.zeros(42, 4), torch.ones(2, 42)
    _growing(kernel, x, y, 42, step)
    assert kernel.launches[-1][2][-1] == 107


def test_integers_off_any_line_replay_nothing(monkeypatch):
    monkeypatch.setattr(replay, "_fill_descriptor", lambda ptr, *fill: ("map", ptr))
    kernel = GrowKernel()
    assert _lengths(kernel, [33, 34, 35, 37, 39], lambda n: n * n) == ["jit"] * 5


def test_under_a_launch_hook_a_length_takes_the_ordinary_path(monkeypatch):
    """A length's recipe has no launches for Triton's own path (which calls a profiler's hook): under a hook its
    call goes the ordinary way, and so does a later call of a kind kept from the lines."""
    monkeypatch.setattr(replay, "_fill_descriptor", lambda ptr, *fill: ("map", ptr))
    kernel = GrowKernel()
    assert _lengths(kernel, [33, 34, 35, 37]) == ["jit", "jit", "jit", "raw"]
    monkeypatch.setattr(replay.knobs.runtime, "launch_enter_hook", replay.knobs.HookChain())
    replay.knobs.runtime.launch_enter_hook.add(lambda meta: None)
    assert _lengths(kernel, [37, 39]) == ["jit", "jit"]


def test_between_two_lengths_planned_alike_the_plan_is_skipped(monkeypatch):
    """A length between two whose plans decided one outcome replays with no plan at all (the call's own path is
    not run); past the lengths planned, or in the span of another outcome not yet proven, the plan runs."""
    monkeypatch.setattr(replay, "_fill_descriptor", lambda ptr, *fill: ("map", ptr))
    kernel, planned = GrowKernel(), []
    outcome = lambda n: n // 40  # noqa: E731
    assert _lengths(kernel, [33, 34, 35, 39, 37], outcome=outcome, planned=planned) == ["jit"] * 3 + ["raw"] * 2
    assert planned == [33, 34, 35, 39]  # 37: between 33 and 39, both planned to outcome 0
    assert _lengths(kernel, [41, 42, 43, 45, 36], outcome=outcome, planned=planned) == ["jit"] * 3 + ["raw"] * 2
    assert planned[4:] == [41, 42, 43, 45]


def test_a_strided_length_makes_no_family(monkeypatch):
    """Inputs carrying the length must be contiguous (their strides then follow from their shapes, so the loose
    key tells everything but the length): a strided one keeps the ordinary path at every length."""
    monkeypatch.setattr(replay, "_fill_descriptor", lambda ptr, *fill: ("map", ptr))
    kernel = GrowKernel()
    hows = []
    for n in (33, 34, 35, 37, 38):
        x, y = torch.zeros(4, n).t(), torch.ones(2, n)
        _growing(kernel, x, y, n)
        hows.append(kernel.launches[-1][0])
    assert hows == ["jit"] * 5 and not replay._FAMILIES


@pytest.mark.parametrize("shape,layout,window", [((1, 32, 8, 1, 64), "bhsd", (-1, -1)),
                                                 ((8, 32, 8, 1, 128), "bshd", (-1, -1)),
                                                 ((2, 28, 4, 4, 128), "bhsd", (4095, 0)),
                                                 ((4, 16, 16, 1, 256), "bshd", (-1, -1)),
                                                 ((1, 8, 1, 16, 64), "bhsd", (1023, 0))])
def test_a_decodes_plan_steps_up_with_the_length(shape, layout, window, monkeypatch):
    """What :func:`fmha.replay.lengthwise` rests on: for a decode on the H200, each outcome of the plan (config,
    keys per split, split count) holds on one span of lengths, so two lengths planned alike enclose only
    lengths planned alike."""
    from fmha import plan as planning
    monkeypatch.setattr(planning, "arch_of", lambda device: "sm90")
    monkeypatch.setattr(planning, "device_facts", lambda index: (9, 132))
    monkeypatch.setattr(planning, "index_of", lambda device: 0)
    b, h, kvh, sq, d = shape
    bhsd = layout == "bhsd"
    q = torch.empty((b, h, sq, d) if bhsd else (b, sq, h, d), dtype=torch.bfloat16)
    spans: dict = {}
    last = None
    for n in range(1, 40000, 7):
        k = torch.empty((b, kvh, n, d) if bhsd else (b, n, kvh, d), dtype=torch.bfloat16)
        prob = planning.problem(b, h, kvh, sq, n, d, causal=True, scale=None, causal_align="bottom_right",
                                window=window)
        p = planning.plan(prob, q, k, k, q, layout, "auto", None, None, 0)
        outcome = p.by_length()
        assert outcome == last or outcome not in spans, (n, outcome)
        spans.setdefault(outcome, n)
        last = outcome
    assert len(spans) > 10


def test_a_proven_family_asks_the_plan_how_far_its_span_reaches(monkeypatch):
    """A cache one key longer at each call is always past the lengths planned: once the family is proven it asks
    the plan (over stand-ins) about lengths ahead in doubling steps while the plan decides alike, then halves the
    last step to the span's end; the calls up to there skip their own checks and plan."""
    monkeypatch.setattr(replay, "_fill_descriptor", lambda ptr, *fill: ("map", ptr))
    kernel, planned, ahead = GrowKernel(), [], []
    outcome = lambda n: n // 40  # noqa: E731
    hows = _lengths(kernel, range(33, 47), outcome=outcome, planned=planned, ahead=ahead)
    assert hows == (["jit"] * 3 + ["raw"] * 4) * 2
    assert ahead == [36, 37, 39, 43, 41, 40, 43, 44, 46, 50, 58, 74, 106, 90, 82, 78, 80, 79]
    assert planned == [33, 34, 35, 40, 41, 42]
    assert [(f.lo, f.hi) for f in replay._FAMILIES[next(iter(replay._FAMILIES))].values()] == [(33, 39), (40, 79)]


def test_a_plan_the_stand_ins_cannot_make_ends_the_span():
    """A length ahead whose plan fails over the stand-ins (a forced variant refusing them) is not known: the span
    ends before it, and the call that asked returns as it would have."""
    family = replay._Family(40)
    family.trusted = [object()]

    def plan_at(m):
        if m > 42:
            raise ValueError("variant 'hopper' cannot take this call")
        return "outcome"
    family.reach(40, "outcome", plan_at)
    assert (family.lo, family.hi) == (40, 42)

