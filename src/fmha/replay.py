"""The eager host path: a call's launches recorded once, replayed for every later call of the same kind.

The first call with a given :func:`key` (shapes, strides, dtypes, devices, pointer alignment, flags)
runs the ordinary path (checks, plan, configs, TMA views, Triton's dispatch) with every launch
recorded (:func:`launch`): the compiled kernel, its grid and its arguments.  What may differ in a
later call with the same key is only where the tensors lie, so the recipe keeps each argument as
it was except the tensors, which it names: an input of the call, a buffer the call allocated
(:func:`buffer`: allocated again, same shape and dtype, at each replay when the call returns it; otherwise
laid in the thread's workspace for the stream, :func:`_workspace`), a tensor whose contents
follow from the key alone (:func:`constant`: a work list built on the host, kept), or a TMA
descriptor over one of them (rebuilt over the new pointer).  Every integer argument is a function
of the key, so Triton's specialization (integers on ``== 1`` and divisibility by 16, pointers on
16-byte alignment: both in the key) is the one the compiled kernel was built for.  A replay
allocates, then launches each compiled kernel directly; no host-device synchronization, no planning.
With no launch hook installed it goes further (:class:`_Launch`): the argument list Triton's launcher
takes is flattened and packed once into a plan (:mod:`fmha.launcher`), TMA descriptors are filled once for
each base pointer a slot meets (:data:`DESCRIPTORS_KEPT` of them), and a replayed launch passes only its
pointers and descriptors to one C function that calls the driver.  An entry point whose call is plain makes its
key before anything else (:func:`replayed`) and replays from there; any other call, and a miss, goes through
:func:`through`.

A call of a new kind takes the ordinary path, but its launches skip Triton's JIT where they can
(:func:`_dispatch`): a launch whose arguments specialize as an earlier launch's of the same kernel did
(same constexprs and options; integers 1, divisible by 16 or neither, alike; tensors of the same dtype and
alignment) goes to the kernel compiled for that launch, as the JIT itself would send it; each kernel's
constexprs and options keep their latest :data:`COMPILED_KEPT` launches.

A growing KV cache (generate()'s first layer meets a new length at every token) makes every call a new kind.
Those kinds differ by one length alone, and a decode's launches take it only through integers affine in it
(the keys' count, K/V's strides and their descriptors' shapes and strides; what else the plan decides from
it, the config and the split, stays in the key): :func:`lengthwise` keeps them as a family, fits each
integer's line through two recordings of the same compiled kernels, proves the lines on a third, and then
replays every later length of the family from them (:class:`_Length`), planned but not launched through
Triton's Python, and not recorded.

A call is recorded only when each of its tensor arguments can be named; otherwise (and under the
interpreter) calls keep the ordinary path.  Triton's launch hooks (a profiler's) see replayed launches
as they see any other.
"""
from __future__ import annotations

import collections
import math
import threading

import torch
from triton import knobs
from triton._C.libtriton import native_specialize_impl as specialize
from triton.runtime import driver
from triton.runtime.jit import JITFunction

from . import launcher as fmha_launcher
from .device import on

_RECIPES: dict = {}
_MAX_RECIPES = 4096  # a long-running server's distinct call kinds; past it the table starts again


class _Thread(threading.local):
    """A thread's state (the class's attributes are what a thread starts with: reading them costs no failed lookup,
    as ``getattr`` with a default on a missing one does)."""
    steps = buffers = constants = tickets = None  # the call being recorded: its launches, buffers, constants, counters
    call = family = None  # the call being recorded: its key, inputs and length; the family that its plan names
    replayed = False  # the call being recorded was replayed from its family
    transient = False  # within :class:`transient`
    workspaces = None  # (device, stream) -> the thread's workspace there


_local = _Thread()
UNRECORDABLE = object()  # the key of a call that was recorded and could not be replayed
DESCRIPTORS_KEPT = 128  # filled TMA descriptors a launch's slot keeps, by base pointer (past it, it starts again)
WORKSPACE_BYTES = 16 << 20  # the most scratch a thread's workspace holds for one stream (a decode's partials)


def key(kind: str, tensors, *flags) -> tuple:
    """What decides a call's launches: each tensor's shape, strides, dtype, device, pointer alignment
    and which earlier tensor of the call starts where it starts (the same cu_seqlens passed for q and k:
    a later call of the kind shares them alike, so either name reaches them), None for an absent one, and
    ``flags`` (hashable)."""
    first: dict = {}
    parts: list = [kind]
    for i, t in enumerate(tensors):
        if t is None:
            parts.append(None)
        else:
            ptr = t.data_ptr()
            parts.append((t.shape, t.stride(), t.dtype, t.device, ptr % 16 == 0, first.setdefault(ptr, i)))
    return (*parts, *flags)


GRID_STEP = 65520  # the most programs a launch puts on grid axis 1 (CUDA takes 65535)


def launch(kernel, grid, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``, recorded when a call is being recorded.  A launch whose kernel Triton
    has compiled for arguments of the same specialization goes to that compiled kernel directly
    (:func:`_dispatch`).  A grid whose axis 1 (a kernel's batch * heads) holds more than :data:`GRID_STEP`
    programs goes as several launches of at most that many, each told the first it covers (``BH_BASE``, a constexpr
    that every kernel with a second grid axis takes and adds to ``program_id(1)``: 0, which adds nothing, for every
    grid within the limit)."""
    if len(grid) > 1 and grid[1] > GRID_STEP:
        for base in range(0, grid[1], GRID_STEP):
            launch(kernel, (grid[0], min(GRID_STEP, grid[1] - base), *grid[2:]), *args, **kwargs, BH_BASE=base)
        return
    compiled = _dispatch(kernel, grid, args, kwargs)
    if compiled is None:
        compiled = kernel[grid](*args, **kwargs)
        _remember(kernel, compiled, args, kwargs)
    steps = _local.steps
    if steps is not None:
        steps.append((kernel, compiled, grid, args, kwargs))


_COMPILED: dict = {}  # (kernel, constexprs, device, launch options, knobs) -> [(compiled kernel, arguments, specs)]
_MAX_COMPILED = 1024
COMPILED_KEPT = 4  # compiled forms a key keeps, the latest first (a growing length's two: divisible by 16 or not)
_PLAIN = (int, float, bool, str)


_SIGNATURES: dict = {}  # kernel -> (each parameter's name and default, the set of names)
_CONSTEXPRS: dict = {}  # JIT kernel -> the places of its constexpr parameters


def _full(kernel, args, kwargs) -> tuple[list, tuple]:
    """Every parameter's argument in the signature's order (keywords and defaults filled in, as the JIT binds
    them), and the launch options (the keyword arguments that are no parameter: ``num_warps`` ...)."""
    sig = _SIGNATURES.get(kernel)
    if sig is None:
        sig = _SIGNATURES[kernel] = ([(n, p.default) for n, p in zip(kernel.arg_names, kernel.params)],
                                     frozenset(kernel.arg_names))
    params, names = sig
    full = list(args)
    full += [kwargs.get(n, default) for n, default in params[len(args):]]
    return full, tuple((n, v) for n, v in kwargs.items() if n not in names)


def _compiled_key(kernel, full, options):
    """What, besides its other arguments' specialization, picks a JIT kernel's compiled form: its constexprs,
    the launch options, the device and the knobs Triton adds to them; None where the launch is not Triton's
    JIT on a GPU (the interpreter, a stand-in) or a launch hook listens (it would see the launch through
    Triton)."""
    if type(kernel).run is not JITFunction.run:  # (under the interpreter a kernel is no JITFunction)
        return None
    if _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook):
        return None
    try:
        places = _CONSTEXPRS.get(kernel)
        if places is None:
            places = _CONSTEXPRS[kernel] = tuple(i for i, p in enumerate(kernel.params) if p.is_constexpr)
        constexprs = tuple((type(full[i]), full[i]) for i in places)
        return (kernel, constexprs, torch._C._cuda_getDevice(), options, knobs.runtime.debug,
                knobs.compilation.instrumentation_mode)
    except TypeError:  # an unhashable option or constexpr
        return None


def _spec(kernel, at: int, value, backend):
    """Triton's specialization of argument ``at`` (an annotated one's value; else its type, and for integers
    and pointers whether it is 1 or divisible by 16, as the JIT's binder computes it)."""
    p = kernel.params[at]
    if p.annotation_type:
        return ("value", type(value), value)
    return specialize(backend, value, p.is_const, not p.do_not_specialize, not p.do_not_specialize_on_alignment)


def _dispatch(kernel, grid, args, kwargs):
    """The compiled kernel Triton's JIT would pick for this launch, launched, when an earlier launch of
    ``kernel`` with the same constexprs and options had its other arguments specialized alike (those that
    differ compared by Triton's own function); None when there is none (the JIT then runs), and for a kernel that
    is no Triton JIT function (a stand-in, or one whose ``run`` is its own)."""
    if not _COMPILED or getattr(type(kernel), "run", None) is not JITFunction.run:
        return None
    full, options = _full(kernel, args, kwargs)
    k = _compiled_key(kernel, full, options)
    seen = _COMPILED.get(k) if k is not None else None
    if seen is None:
        return None
    backend = kernel.device_caches[k[2]][3]
    for compiled, ref, specs in seen:
        if _alike(kernel, full, ref, specs, backend):
            break
    else:
        return None
    grid = tuple(grid) + (1,) * (3 - len(grid))
    stream = torch._C._cuda_getCurrentRawStream(k[2])
    compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, None,
                 knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *full)  # (no hook listens)
    return compiled


def _alike(kernel, full, ref, specs, backend) -> bool:
    """Whether arguments ``full`` specialize as the kept launch's did (``ref``: its plain values, ``specs``:
    its other arguments' specializations, filled in as they are asked for)."""
    for at, (a, r) in enumerate(zip(full, ref)):
        if type(a) is type(r) and a == r:  # (a plain value, a constexpr among them)
            continue
        want = specs.get(at)
        if want is None:
            want = specs[at] = _spec(kernel, at, r, backend)
        if _spec(kernel, at, a, backend) != want:
            return False
    return True


def _remember(kernel, compiled, args, kwargs) -> None:
    """Keep ``compiled`` as ``kernel``'s compiled form for launches like this one (:func:`_dispatch`)."""
    if type(kernel).run is not JITFunction.run:
        return
    full, options = _full(kernel, args, kwargs)
    k = _compiled_key(kernel, full, options)
    if k is None or getattr(compiled, "function", None) is None:
        return
    if len(_COMPILED) >= _MAX_COMPILED:
        _COMPILED.clear()
    backend = kernel.device_caches[k[2]][3]
    ref, specs = [], {}  # keeps no tensor of the call alive
    for at, a in enumerate(full):
        if a is None or type(a) in _PLAIN:
            ref.append(a)
        else:
            ref.append(_Opaque)
            specs[at] = _spec(kernel, at, a, backend)
    kept = [entry for entry in _COMPILED.get(k, ()) if entry[0] is not compiled]
    _COMPILED[k] = [(compiled, ref, specs), *kept[:COMPILED_KEPT - 1]]


class _Opaque:
    """Stands for a tensor or descriptor argument in :data:`_COMPILED` (its specialization is kept)."""


def buffer(t: torch.Tensor) -> torch.Tensor:
    """``t``, a tensor the call allocated whose contents its launches write: a replay allocates its own."""
    if _local.steps is not None:
        _local.buffers.append(t)
    return t


def host_work() -> None:
    """The call being recorded writes its outputs by more than its launches (an edge answered with
    ``zero_()`` after a check's launch): a replay, which makes only the launches, would return them unwritten,
    so the kind keeps the ordinary path."""
    if _local.steps is not None:
        _local.steps.append(None)


def holding(device: torch.device, stream: int | None = None) -> bool:
    """Whether a call may keep buffers past its end (the thread's workspace, a stream's counters): not while the
    stream is captured into a CUDA graph, nor inside :func:`transient` (a custom op's call from compiled code,
    whose CUDA graphs, torch.compile's cudagraph trees, run their warm-up in the graphs' memory pool: a buffer
    kept from there would be a live block of the pool that no graph owns, which the trees refuse).  ``stream``:
    the device's current raw stream where the caller has it; the legacy default stream (0, an eager program's)
    is never captured (CUDA refuses to capture it), so the capture query, microseconds of a call, is not made."""
    if _local.transient:
        return False
    return device.type != "cuda" or stream == 0 or not torch._C._cuda_isCurrentStreamCapturing()


class transient:
    """Within it, calls keep no buffer past their end (:func:`holding`)."""

    def __enter__(self):
        self.before = _local.transient
        _local.transient = True

    def __exit__(self, *exc):
        _local.transient = self.before


_TICKETS: dict = {}  # (device, stream) -> int32 counters, left at zero by every launch that takes them


def tickets(device: torch.device, n: int) -> torch.Tensor:
    """At least ``n`` int32 counters at zero for a launch that counts its programs as they finish (a split
    launch merging its own partials: each launch leaves them at zero), one block per device and stream: the
    launches of one stream run one after another, two streams' never share counters.  A replay takes the
    block of the stream it launches on."""
    block = _tickets(device, _stream(device), n)
    if _local.steps is not None:
        _local.tickets.append(block)
    return block


def _tickets(device: torch.device, stream: int, n: int) -> torch.Tensor:
    block = _TICKETS.get((device, stream))
    if block is None or block.numel() < n:
        if block is None and len(_TICKETS) >= 64:  # streams come from torch's pool; past it, start again
            _TICKETS.clear()
        block = _TICKETS[(device, stream)] = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
    return block


def constant(t: torch.Tensor) -> torch.Tensor:
    """``t``, a tensor whose contents follow from the call's key alone: a replay passes this one."""
    if _local.steps is not None:
        _local.constants.append(t)
    return t


class _Descriptor:
    """What Triton's launcher reads of a TMA descriptor (base, shape, strides, padding), over a new base."""
    __slots__ = ("base", "shape", "strides", "padding")

    def __init__(self, base, shape, strides, padding):
        self.base, self.shape, self.strides, self.padding = base, shape, strides, padding


class Recipe:
    """The launches of one kind of call, with the tensors named (:mod:`fmha.replay`)."""

    def __init__(self, steps, inputs, outputs, buffers, constants, counters=()):
        self.buffers = []  # (shape, dtype) of each buffer the call allocates, then of each block of counters
        self.tickets = []  # (buffer index, counters): the blocks of :func:`tickets`, the launching stream's
        # per launch: (compiled kernel, its launcher, function and packed metadata, grid, argument template,
        # [(position, is an input, index)], [(position, is an input, index, shape, strides, padding)])
        self.steps = []
        self.constants = constants  # kept alive: the templates hold them
        named = {id(t): (True, i) for i, t in enumerate(inputs) if t is not None}  # (is an input, index)
        keep = {id(t) for t in constants}
        for t in buffers:
            if id(t) not in named:
                if not t.is_contiguous():
                    raise LookupError("a strided buffer")
                named[id(t)] = (False, len(self.buffers))
                self.buffers.append((tuple(t.shape), t.dtype))
        for t in counters:
            if id(t) not in named:
                named[id(t)] = (False, len(self.buffers))
                self.tickets.append((len(self.buffers), t.numel()))
                self.buffers.append((tuple(t.shape), t.dtype))
        tensors = [t for t in (*inputs, *buffers, *counters) if t is not None]
        at = {t.data_ptr(): named[id(t)] for t in tensors}  # views made inside the call start there

        def name(t):
            slot = named.get(id(t)) or at.get(t.data_ptr())
            if slot is None:
                raise LookupError("a tensor the recipe cannot name")
            return slot
        for kernel, compiled, grid, args, kwargs in steps:
            full = _full(kernel, args, kwargs)[0]
            plain, descs = [], []  # the template keeps no tensor of the recorded call alive
            for pos, a in enumerate(full):
                if a is None or type(a) in _PLAIN:
                    continue
                if isinstance(a, torch.Tensor) and id(a) not in keep:
                    plain.append((pos, *name(a)))
                    full[pos] = None
                elif hasattr(a, "base") and hasattr(a, "block_shape") and id(a.base) not in keep:  # TMA
                    descs.append((pos, *name(a.base), a.shape, a.strides, a.padding))
                    full[pos] = None
            grid = tuple(grid) + (1,) * (3 - len(grid))
            self.steps.append((compiled, compiled.run, compiled.function, compiled.packed_metadata, grid, full,
                               plain, descs))
        self.outputs = [None if t is None else name(t) for t in outputs]
        # the fast path allocates the buffers it returns (given their strides: ``torch.empty_strided`` takes a
        # third of ``torch.empty``'s host time), and one block for the others (partials of a split)
        returned = {o[1] for o in self.outputs if o is not None and not o[0]}
        self.returned = [(i, shape, _dense_strides(shape), dtype) for i, (shape, dtype) in enumerate(self.buffers)
                         if i in returned]
        counting = {i for i, _ in self.tickets}
        self.scratch, self.scratch_bytes = [], 0
        for i, (shape, dtype) in enumerate(self.buffers):
            if i not in returned and i not in counting:
                self.scratch.append((i, self.scratch_bytes))
                self.scratch_bytes += -(-math.prod(shape) * dtype.itemsize // 256) * 256
        try:
            self.fast = [_Launch(*step) for step in self.steps]
        except LookupError:  # a launcher this module does not know how to drive: Triton's own path
            self.fast = None

    def run(self, inputs, device: torch.device, held: bool | None = None, stream: int | None = None):
        """Launch the recorded kernels over ``inputs`` (in the recorded order); returns the outputs (None: a
        length's recipe, :class:`_Length`, under a launch hook).  ``held`` (:func:`holding`) and ``stream`` (the
        device's current raw stream): the call's, where its caller has them already (None: found here)."""
        if device.type != "cuda" or device.index == torch._C._cuda_getDevice():
            return self._run(inputs, device, held, stream)
        with on(device):
            return self._run(inputs, device, held, stream)

    def _run(self, inputs, device, held, stream):
        if stream is None:
            stream = _stream(device)
        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook  # a profiler's, as Triton's
        if self.fast is not None and not _hooked(enter) and not _hooked(leave):
            n = len(inputs)
            ptrs = [None if t is None else t.data_ptr() for t in inputs] + [None] * len(self.buffers)
            buffers = [None] * len(self.buffers)
            for i, shape, strides, dtype in self.returned:
                buffers[i] = torch.empty_strided(shape, strides, dtype=dtype, device=device)
                ptrs[n + i] = buffers[i].data_ptr()
            if self.scratch_bytes:
                scratch = _workspace(self.scratch_bytes, device, stream, held)
                base = scratch.data_ptr()
                for i, offset in self.scratch:
                    ptrs[n + i] = base + offset
            for i, count in self.tickets:
                ptrs[n + i] = _tickets(device, stream, count).data_ptr()
            for step in self.fast:
                step(ptrs, n, stream)
            return [None if o is None else (inputs[o[1]] if o[0] else buffers[o[1]]) for o in self.outputs]
        if self.steps is None:  # a length's recipe (:class:`_Length`) has no launches for Triton's own path
            return None
        buffers = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in self.buffers]
        for i, count in self.tickets:
            buffers[i] = _tickets(device, stream, count)
        for compiled, launcher, function, packed, grid, template, plain, descs in self.steps:
            args = template.copy()
            for pos, is_input, i in plain:
                args[pos] = inputs[i] if is_input else buffers[i]
            for pos, is_input, i, shape, strides, padding in descs:
                args[pos] = _Descriptor(inputs[i] if is_input else buffers[i], shape, strides, padding)
            meta = compiled.launch_metadata(grid, stream, *args) if enter is not None else None
            launcher(grid[0], grid[1], grid[2], stream, function, packed, meta, enter, leave, *args)
        return [None if o is None else (inputs[o[1]] if o[0] else buffers[o[1]]) for o in self.outputs]


def _dense_strides(shape: tuple) -> tuple:
    """The strides of a contiguous tensor of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _workspace(nbytes: int, device: torch.device, stream: int, held: bool | None = None) -> torch.Tensor:
    """At least ``nbytes`` of scratch for a replay's launches on ``stream``: this thread's workspace on that
    stream, grown when short (the launches of one thread on one stream run in the order they were enqueued,
    so each call's use of it ends before the next call's begins, as cuBLAS's workspace does).  While the
    stream is being captured into a CUDA graph (or where the call may hold nothing, :func:`holding`), a block of
    its own, freed when the call returns (a capture's later work reuses it in order); likewise past
    :data:`WORKSPACE_BYTES`, where a call's kernels outlast an allocation's cost and a held block would keep
    memory from everything else.  ``held``: :func:`holding`, where the call has asked already."""
    if nbytes > WORKSPACE_BYTES or not (holding(device) if held is None else held):
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    spaces = _local.workspaces
    if spaces is None:
        spaces = _local.workspaces = {}
    block = spaces.get((device.index, stream))
    if block is None or block.numel() < nbytes:
        if block is None and len(spaces) >= 64:  # streams come from torch's pool; past it, start again
            spaces.clear()
        block = spaces[(device.index, stream)] = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return block


def _hooked(chain) -> bool:
    """A launch hook is installed (Triton's hooks are chains, empty when nobody listens)."""
    return chain is not None and bool(getattr(chain, "calls", True))


def _launchable(launcher) -> None:
    """LookupError where a launch cannot be sent from a plan (:mod:`fmha.launcher`): ROCm's launcher, or
    scratch memory to allocate per launch."""
    if torch.version.hip:
        raise LookupError("ROCm's launcher")
    if getattr(launcher, "global_scratch_size", 1) or getattr(launcher, "profile_scratch_size", 1):
        raise LookupError("a launch with scratch memory")


class _Launch:
    """One recorded launch, sent from its plan (:mod:`fmha.launcher`): the flattened argument list of Triton's
    launcher (Triton's own expansion of a tensor descriptor: the filled CUtensorMap, or the base pointer, then
    shape and strides) packed at its first call (a recording that only teaches a family its lines never is), with
    the slots that change between calls: pointers, and descriptors filled for each new base."""
    __slots__ = ("send", "compiled", "grid", "flags", "device", "tys", "flat", "ptr_slots", "desc_slots", "sources",
                 "plan", "at", "pointers", "filled")

    def __init__(self, compiled, launcher, _function, _packed, grid, template, plain, descs):
        """A step of :class:`Recipe` (the plan reads the function and packed metadata off ``compiled``)."""
        from triton.backends.nvidia import driver as nv
        _launchable(launcher)
        self.compiled, self.grid = compiled, grid
        self.flags = (launcher.launch_cooperative_grid, launcher.launch_pdl)
        self.device = torch._C._cuda_getDevice() if torch.cuda.is_available() else 0  # (the recording's)
        self.tys = fmha_launcher.types(compiled)
        metas = list(getattr(compiled.metadata, "tensordesc_meta", None) or [])
        at = {pos: (is_input, i, shape, strides, padding) for pos, is_input, i, shape, strides, padding in descs}
        ptr_at = {pos: (is_input, i) for pos, is_input, i in plain}
        flat, self.ptr_slots, self.desc_slots = [], [], []
        for pos, a in enumerate(template):
            if pos in ptr_at:
                self.ptr_slots.append((len(flat), *ptr_at[pos]))
                flat.append(None)
            elif pos in at:
                is_input, i, shape, strides, padding = at[pos]
                meta = metas.pop(0) if metas else None
                if meta is None:
                    self.desc_slots.append((len(flat), is_input, i, None))
                    flat += [None, *shape, *strides, padding == "nan", *shape, *strides]
                else:
                    if meta.get("fp4_padded"):
                        raise LookupError("an fp4 descriptor")
                    fill = (meta["swizzle"], meta["elem_size"], nv.TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]],
                            meta["block_size"], list(shape), list(strides), 1 if padding == "nan" else 0)
                    self.desc_slots.append((len(flat), is_input, i, fill))
                    flat += [None, *shape, *strides]
            else:
                flat.append(a)
        self.flat = flat
        # the call's arguments, its pointers (and descriptors lowered to pointers) first, then its descriptors
        pointers = [(at, is_input, i) for at, is_input, i in self.ptr_slots]
        pointers += [(at, is_input, i) for at, is_input, i, fill in self.desc_slots if fill is None]
        self.pointers = [(is_input, i) for _, is_input, i in pointers]
        self.sources = {at: k for k, (at, _, _) in enumerate(pointers)}
        self.sources.update({at: len(pointers) + k for k, (at, _, _, _) in
                             enumerate(s for s in self.desc_slots if s[3] is not None)})
        fmha_launcher.check(compiled, flat, self.sources)
        self.plan = self.at = None
        # flat position -> {base pointer: its filled descriptor}: the bases a slot has seen (the KV caches of a
        # model's layers, which share one recipe, take turns in a decode's K and V slots)
        self.filled = {at: {} for at, _, _, fill in self.desc_slots if fill is not None}
        self.send = fmha_launcher.sender()

    def _pack(self):
        self.plan, self.at = fmha_launcher.plan(self.compiled, self.grid, *self.flags, self.flat, self.sources,
                                                self.device)

    def places(self, positions) -> list:
        """Where the integers at ``positions`` of the argument list lie in the plan (:func:`fmha.launcher.value_places`;
        the plan packed first)."""
        if self.plan is None:
            self._pack()
        return fmha_launcher.value_places(self.tys, self.at, positions)

    def at_length(self, places, values, desc_slots):
        """This launch with the integers ``values`` at ``places`` of its plan (:meth:`places`) and the descriptor
        slots ``desc_slots`` (another length's, :class:`_Length`); its filled descriptors its own."""
        launch = _Launch.__new__(_Launch)
        launch.send, launch.compiled, launch.grid, launch.flags, launch.device, launch.tys = (
            self.send, self.compiled, self.grid, self.flags, self.device, self.tys)
        launch.ptr_slots, launch.pointers, launch.sources, launch.at = (
            self.ptr_slots, self.pointers, self.sources, self.at)
        launch.flat = None  # (the plan holds the values: only a recording's launch is packed from its list)
        launch.desc_slots = desc_slots
        launch.plan = fmha_launcher.with_values(self.plan, places, values)
        launch.filled = {at: {} for at, _, _, fill in desc_slots if fill is not None}
        return launch

    def __call__(self, ptrs, n_inputs, stream):
        if self.plan is None:
            self._pack()
        args = [ptrs[i if is_input else n_inputs + i] for is_input, i in self.pointers]
        for at, is_input, i, fill in self.desc_slots:
            if fill is None:
                continue
            ptr = ptrs[i if is_input else n_inputs + i]
            seen = self.filled[at]
            desc = seen.get(ptr)
            if desc is None:
                if len(seen) >= DESCRIPTORS_KEPT:
                    seen.clear()
                desc = seen[ptr] = _fill_descriptor(ptr, *fill)
            args.append(desc)
        self.send(self.plan, stream, *args)


def _fill_descriptor(ptr, *fill):
    """A CUtensorMap over ``ptr`` (Triton's filler, as its launcher calls it)."""
    return driver.active.utils.fill_tma_descriptor(ptr, *fill)


def _stream(device: torch.device) -> int:
    return torch._C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else 0


def through(kind: str, inputs, run, *flags, checks=None, lengths=None):
    """``run()`` on a CPU; on a GPU through :func:`call`, the call's kind being ``kind``, its tensors ``inputs``
    (the first on the call's device) and ``flags``.  ``checks()`` (the entry point's, when they are a function
    of the kind) runs before a call that is not replayed; ``lengths``: :func:`call`'s."""
    first = inputs[0]
    if not first.is_cuda:
        if checks is not None:
            checks()
        return run()
    device = first.device
    stream = _stream(device)
    held = holding(device, stream)  # (a forward's split merges apart where a call holds nothing: merge_in_split)
    return tuple(call(key(kind, inputs, *flags, held), inputs, device, run, checks, lengths, held, stream))


def replayed(kind: str, inputs, *flags, lengths=None):
    """The outputs of a call on a GPU whose kind (:func:`through`'s of the same ``kind``, ``inputs`` and ``flags``) the
    replay table holds, or whose family knows its length (``lengths()``: :func:`call`'s ``lengths``, asked on a
    miss), replayed; None otherwise (the caller then takes its ordinary path, through :func:`through`).  An entry
    point's shortest way to a replay: the call's key made before anything else of the call."""
    device = inputs[0].device
    stream = _stream(device)
    held = holding(device, stream)
    k = key(kind, inputs, *flags, held)
    recipe = _RECIPES.get(k)
    if recipe is None:
        if lengths is None or _local.steps is not None:
            return None
        return _by_length(k, inputs, device, lengths(), held, stream)[1]
    return None if recipe is UNRECORDABLE else recipe.run(inputs, device, held, stream)


def call(k: tuple, inputs, device: torch.device, run, checks=None, lengths=None, held: bool | None = None,
         stream: int | None = None):
    """``run()`` (returning the call's outputs) for the first call of kind ``k``, recorded; the recipe
    for every later one.  ``checks()``, a function of the kind, runs before any call not replayed: a recipe
    exists only for a kind whose checks passed.  ``lengths = ({the index of an input: its dimension}, n)``: a
    kind that differs from others by that one length ``n`` alone (a decode against a KV cache one key longer
    at each call), replayed from its family's recipes where they know it (:func:`lengthwise`).  ``held`` and
    ``stream``: the call's, where the caller has them (:meth:`Recipe.run`).  Returns the outputs."""
    recipe = _RECIPES.get(k)
    if recipe is not None and recipe is not UNRECORDABLE:
        outputs = recipe.run(inputs, device, held, stream)
        if outputs is not None:
            return outputs
        del _RECIPES[k]  # a length's recipe under a launch hook (:meth:`Recipe.run`): the ordinary path
        recipe = None
    loose = None
    if recipe is None and lengths is not None and _local.steps is None:
        loose, outputs = _by_length(k, inputs, device, lengths, held, stream)
        if outputs is not None:
            return outputs
    if checks is not None and (loose is None or loose not in _FAMILIES):  # (a family's first call ran them: they
        checks()  # are a function of its loose key, as a replay's are of its key)
    if recipe is UNRECORDABLE or _local.steps is not None:
        outer = _local.call  # (a call inside one being recorded: not the family's to replay)
        _local.call = None
        try:
            return run()
        finally:
            _local.call = outer
    _local.steps, _local.buffers, _local.constants, _local.tickets = steps, buffers, constants, counters = \
        [], [], [], []
    _local.call = (k, inputs, device, loose, lengths[1] if loose is not None else None)
    _local.family, _local.replayed = None, False
    try:
        outputs = run()
        family, replayed = _local.family, _local.replayed
    finally:
        _local.steps = _local.buffers = _local.constants = _local.tickets = None
        _local.call = _local.family = None
    if replayed:  # :func:`lengthwise` replayed it from its family (its recipe kept under ``k``)
        family[0].reach(*family[1:])
        return outputs
    if len(_RECIPES) >= _MAX_RECIPES:
        _RECIPES.clear()
    if not steps or any(s is not None and s[1] is None for s in steps):  # an edge answered without a launch;
        return outputs  # the interpreter
    if None in steps:  # :func:`host_work`
        _RECIPES[k] = UNRECORDABLE
        return outputs
    try:
        _RECIPES[k] = recipe = Recipe(steps, inputs, outputs, buffers, constants, counters)
    except LookupError:
        _RECIPES[k] = UNRECORDABLE
        return outputs
    if family is not None:
        family[0].learn(family[1], recipe)
        family[0].reach(*family[1:])
    return outputs


_FAMILIES: dict = {}  # a kind with its length left out (:func:`_loose`) -> {the plan's outcome: its _Family}
_MAX_FAMILIES = 256


def _loose(k: tuple, inputs, dims: dict, n: int):
    """Key ``k`` with the length left out of the inputs that carry it (their shapes there; their strides, which
    follow from their shapes: each must be contiguous), or None (one is not contiguous, or its length is not
    ``n``): two kinds with one loose key differ by ``n`` alone."""
    parts = list(k)
    for i, dim in dims.items():
        t = inputs[i]
        if t is None or t.shape[dim] != n or not t.is_contiguous():
            return None
        shape = tuple(parts[1 + i][0])
        parts[1 + i] = (shape[:dim] + (None,) + shape[dim + 1:], *parts[1 + i][2:])
    return tuple(parts)


def _by_length(k, inputs, device, lengths, held, stream) -> tuple:
    """``(loose key, outputs)`` of a call of kind ``k`` with ``lengths`` (:func:`call`'s; None: no length) that the
    table does not hold: its loose key (:func:`_loose`, None where it has none) and, where a family knows its length,
    its outputs (:func:`_known_length`), else None."""
    loose = _loose(k, inputs, *lengths) if lengths is not None else None
    return loose, (_known_length(k, inputs, device, loose, lengths[1], held, stream) if loose is not None else None)


def _known_length(k, inputs, device, loose, n: int, held: bool | None = None, stream: int | None = None):
    """The outputs of a call at length ``n`` that a family already knows: ``n`` lies between two lengths whose
    plans decided alike (the plan's outcome is constant between them: :func:`lengthwise`), and a proven
    :class:`_Length` of that outcome gives its launches (no checks, no plan; as a replay, the checks being a
    function of the kind).  None otherwise."""
    for family in _FAMILIES.get(loose, {}).values():
        if family.lo <= n <= family.hi:
            outputs = family.replay(k, inputs, device, n, held, stream)
            if outputs is not None:
                return outputs
    return None


def lengthwise(outcome, plan_at=None):
    """Inside the call being recorded (:func:`call` with ``lengths``), after its plan: ``outcome`` is what the
    plan decided from the length besides the launches' integers (the config, the keys per split, the split
    count; hashable), ``plan_at(m)`` the outcome the plan would give at length ``m``.  The lengths whose plans
    decided one outcome form a family; between two of them the plan decides it too (the planner's choices only
    step up as the length grows: ``tests/test_replay.py`` sweeps it), so a call in that span skips the checks
    and the plan (:func:`_known_length`).  Once the family has a proven recipe, ``plan_at`` finds how far ahead
    the span reaches (:meth:`_Family.reach`), so a cache one key longer at each call meets lengths the family
    knows.  Returns the call's outputs when a proven recipe of the family replays it (the call is then kept
    under its own key, its launches not made again); None: the call goes on through the ordinary path and its
    recording teaches the family."""
    now = _local.call
    if now is None or now[3] is None:
        return None
    k, inputs, device, loose, n = now
    families = _FAMILIES.get(loose)
    if families is None:
        if len(_FAMILIES) >= _MAX_FAMILIES:
            _FAMILIES.clear()
        families = _FAMILIES[loose] = {}
    family = families.get(outcome)
    if family is None:
        family = families[outcome] = _Family(n)
    family.lo, family.hi = min(family.lo, n), max(family.hi, n)
    _local.family = (family, n, outcome, plan_at)
    outputs = family.replay(k, inputs, device, n)
    _local.replayed = outputs is not None
    return outputs


def growing() -> bool:
    """Whether the call being recorded is a member of a length family met before (:func:`lengthwise`: its kind met
    at another length, by a call with ``lengths``), held or not (the last part of a key, :func:`call`): a KV cache
    that grows into a new tensor at each call, as transformers' does in generate(), whose plan reads it by pointer
    (:func:`fmha.plan.plan`).  A kind met at one length only (a static cache) is not.  Either way a graph's capture
    plans as the eager calls of its kind did, so it launches the kernels their warm-up loaded (the driver refuses to
    load one while a stream is captured)."""
    now = _local.call
    loose = now[3] if now is not None else None
    return loose is not None and (loose in _FAMILIES or (*loose[:-1], not loose[-1]) in _FAMILIES)


def _line(x, nx: int, y, ny: int):
    """``(a, b)`` with ``x = a + b * nx`` and ``y = a + b * ny`` in integers, or None."""
    if type(x) is not int or type(y) is not int or (y - x) % (ny - nx):
        return None
    b = (y - x) // (ny - nx)
    return x - b * nx, b


def _specialized(v: int) -> tuple:
    """What Triton's specialization of an integer argument reads of it (1, divisible by 16, 32 bits wide)."""
    return v == 1, v % 16 == 0, -(1 << 31) <= v < (1 << 31)


_INT32 = (-(1 << 31), (1 << 31) - 1)


def _within(a: int, b: int, lo, hi) -> tuple:
    """The lengths ``n`` (an interval, None for an open end) where ``lo <= a + b * n <= hi`` (None: no bound),
    ``b != 0``."""
    if b < 0:
        a, b, lo, hi = -a, -b, (None if hi is None else -hi), (None if lo is None else -lo)
    return (None if lo is None else -((a - lo) // b)), (None if hi is None else (hi - a) // b)


def _steady(a: int, b: int, n: int) -> tuple:
    """The lengths around ``n`` (an interval, None for an open end) where ``a + b * n`` stays 1 or not 1, and 32 bits
    wide or not, as it is at ``n``: where its specialization changes with its divisibility by 16 alone."""
    v = a + b * n
    if b == 0:
        return None, None
    ones = (n, n) if v == 1 else _within(a, b, 2, None) if v > 1 else _within(a, b, None, 0)
    bits = _within(a, b, *_INT32) if _INT32[0] <= v <= _INT32[1] else (
        _within(a, b, _INT32[1] + 1, None) if v > 0 else _within(a, b, None, _INT32[0] - 1))
    return _tighter(ones[0], bits[0], max), _tighter(ones[1], bits[1], min)


def _tighter(x, y, pick):
    return y if x is None else x if y is None else pick(x, y)


def _descriptors(launch, fills, n: int):
    """``launch``'s descriptor slots at length ``n``, each slot with lines in ``fills`` (:class:`_Length`) filled over
    their shape and strides there; None where a size would not be positive."""
    if fills.count(None) == len(fills):
        return launch.desc_slots
    slots = []
    for slot, lines in zip(launch.desc_slots, fills):
        if lines is not None:
            shape = [a + b * n for a, b in lines[0]]
            if min(shape) < 1:
                return None
            fill = slot[3]
            slot = (*slot[:3], (*fill[:4], shape, [a + b * n for a, b in lines[1]], fill[6]))
        slots.append(slot)
    return slots


class _Length:
    """A recipe whose launches' integers (kernel arguments, descriptor shapes and strides) are affine in one
    length ``n``, each ``a + b * n`` (:meth:`fit`), every other part as recorded; :meth:`at` gives the
    recipe for a length whose integers specialize as the recorded ones did (the same compiled kernels)."""

    def __init__(self, recipe, launches, n: int):
        """``launches``: per launch of ``recipe``, ``([(flat position, a, b, specialization)], [None or (shape,
        strides)])``, the integers' specializations those at ``n``."""
        self.recipe = recipe
        self.launches = launches
        # the lengths around n where each integer's specialization moves with its divisibility by 16 alone, and
        # the lengths' residues mod 16 where every integer's divides as it did: :meth:`specializes` without
        # evaluating each integer
        self.lo = self.hi = None
        residues = set(range(16))
        for ints, _ in launches:
            for _, a, b, spec in ints:
                lo, hi = _steady(a, b, n)
                self.lo, self.hi = _tighter(self.lo, lo, max), _tighter(self.hi, hi, min)
                residues = {r for r in residues if ((a + b * r) % 16 == 0) == spec[1]}
        self.residues = frozenset(residues)
        self.sends = None  # per launch: (the plan's places of the integers that move, their lines); at first use

    @staticmethod
    def fit(ra, na: int, rb, nb: int):
        """The :class:`_Length` through two recipes of one family at lengths ``na != nb``, or None where they
        differ in more than integers on lines (other launches, grids, buffers, a float, a constant tensor)."""
        if (na == nb or ra.fast is None or rb.fast is None or ra.constants or rb.constants
                or (ra.buffers, ra.tickets, ra.outputs) != (rb.buffers, rb.tickets, rb.outputs)
                or not _same_kernels(ra, rb)):
            return None
        launches = []
        for la, lb in zip(ra.fast, rb.fast):
            if la.ptr_slots != lb.ptr_slots or len(la.flat) != len(lb.flat) or len(la.desc_slots) != len(
                    lb.desc_slots):
                return None
            ints = []
            for at, (x, y) in enumerate(zip(la.flat, lb.flat)):
                if type(x) is type(y) and x == y:
                    continue
                line = _line(x, na, y, nb)
                if line is None:
                    return None
                ints.append((at, *line, _specialized(x)))
            fills = []
            for sa, sb in zip(la.desc_slots, lb.desc_slots):
                fa, fb = sa[3], sb[3]
                if sa[:3] != sb[:3] or (fa is None) != (fb is None):
                    return None
                if fa is None:
                    fills.append(None)
                    continue
                if fa[:4] != fb[:4] or fa[6] != fb[6] or len(fa[4]) != len(fb[4]) or len(fa[5]) != len(fb[5]):
                    return None
                lines = [[_line(x, na, y, nb) for x, y in zip(fa[j], fb[j])] for j in (4, 5)]
                if None in lines[0] or None in lines[1]:
                    return None
                fills.append(lines)
            launches.append((ints, fills))
        return _Length(ra, launches, na)

    def _predicted(self, n: int, specialized: bool = True):
        """Per launch, the argument list and descriptor slots at length ``n``; None where a descriptor's size would
        not be positive, or (``specialized``) an integer would specialize otherwise than the recorded one did."""
        if specialized and not self.specializes(n):  # (checked before anything is built)
            return None
        out = []
        for launch, (ints, fills) in zip(self.recipe.fast, self.launches):
            flat = launch.flat.copy()
            for at, a, b, _ in ints:
                flat[at] = a + b * n
            slots = _descriptors(launch, fills, n)
            if slots is None:
                return None
            out.append((flat, slots))
        return out

    def specializes(self, n: int) -> bool:
        """Whether every integer specializes at length ``n`` as it did where these lines were recorded."""
        if (self.lo is None or self.lo <= n) and (self.hi is None or n <= self.hi):
            return n % 16 in self.residues
        return all(_specialized(a + b * n) == spec for ints, _ in self.launches for _, a, b, spec in ints)

    def at(self, n: int):
        """The recipe at length ``n`` (its launches without Triton's own path: under a launch hook it answers
        None, :meth:`Recipe.run`), or None where an integer would specialize otherwise or a descriptor's size
        would not be positive.  Only what a launch sends is made: its plan with the integers of ``n`` written in,
        and its descriptors' shapes and strides."""
        if not self.specializes(n):
            return None
        if self.sends is None:
            self.sends = []
            for launch, (ints, _) in zip(self.recipe.fast, self.launches):
                places = launch.places([at for at, _, _, _ in ints])
                self.sends.append(([p for p in places if p is not None],
                                   [(a, b) for (_, a, b, _), p in zip(ints, places) if p is not None]))
        fast = []
        for launch, (_, fills), (places, lines) in zip(self.recipe.fast, self.launches, self.sends):
            slots = _descriptors(launch, fills, n)
            if slots is None:
                return None
            fast.append(launch.at_length(places, [a + b * n for a, b in lines], slots))
        recipe = Recipe.__new__(Recipe)  # (a shallow copy, as copy.copy makes it, for a fraction of its cost)
        recipe.__dict__.update(self.recipe.__dict__)
        recipe.fast = fast
        recipe.steps = None
        return recipe

    def _matches(self, n: int, recipe, specialized: bool = True) -> bool:
        """Whether ``recipe``, recorded at ``n``, launches what the lines give there (the same buffers, grids and
        launch flags, argument lists and descriptor slots; with ``specialized``, the same compiled kernels too)."""
        predicted = self._predicted(n, specialized)
        mine = self.recipe
        return (predicted is not None and recipe.fast is not None and not recipe.constants
                and (mine.buffers, mine.tickets, mine.outputs) == (recipe.buffers, recipe.tickets, recipe.outputs)
                and len(recipe.fast) == len(mine.fast)
                and all((a.compiled is b.compiled or not specialized) and a.grid == b.grid and a.flags == b.flags
                        and flat == b.flat and slots == b.desc_slots
                        for a, b, (flat, slots) in zip(mine.fast, recipe.fast, predicted)))

    def predicts(self, n: int, recipe) -> bool:
        """Whether :meth:`at` ``n`` launches what ``recipe``, recorded at ``n``, launches."""
        return self._matches(n, recipe)

    def over(self, n: int, recipe):
        """These lines over ``recipe``'s compiled kernels, which it was recorded at length ``n`` with, where the
        integers specialize otherwise than the recorded ones did (a length divisible by 16): a :class:`_Length`
        for the lengths that specialize as ``n`` does, or None where ``recipe`` launches anything but what the lines
        give at ``n``.  The lines are the plan's integers, whichever compiled kernel takes them: proven once
        already, they need no second pair of recordings."""
        if self._predicted(n) is not None or not self._matches(n, recipe, specialized=False):
            return None  # (where the integers specialize as recorded, the lines replay ``n`` themselves)
        return _Length(recipe, [([(at, a, b, _specialized(a + b * n)) for at, a, b, _ in ints], fills)
                                for ints, fills in self.launches], n)


class _Family:
    """The recipes of calls whose kinds differ by one length alone (:func:`lengthwise`), learning from them: two
    recordings of the same kernels at two lengths give a :class:`_Length` through both, which a third recording
    must match exactly before it replays any call (then :meth:`_Length.at`)."""
    __slots__ = ("pending", "candidates", "trusted", "lo", "hi", "kept")
    KEPT = 4  # recordings kept waiting for a partner, candidates and trusted lines
    # the latest lengths whose recipes the family leaves in the replay table: a model's layers meet one length in
    # turn (its first layer replays from the family, the others that recipe), a few sequences decoded apart a few;
    # a cache one key longer at each call would fill the table otherwise, and empty it of every other kind
    KEPT_LENGTHS = 16

    def __init__(self, n: int):
        self.pending, self.candidates, self.trusted = [], [], []
        self.lo = self.hi = n  # the shortest and longest lengths planned to this family's outcome
        self.kept = collections.deque()  # the keys of those lengths, the oldest first

    def at(self, n: int):
        """A proven recipe at length ``n`` (the first whose integers specialize there as they did), or None."""
        for line in self.trusted:
            recipe = line.at(n)
            if recipe is not None:
                return recipe
        return None

    REACH = 1024  # how far past the longest length planned the span is sought

    def reach(self, n: int, outcome, plan_at) -> None:
        """Once the family has a proven recipe and ``n`` is its longest length planned: the longest length up to
        :data:`REACH` ahead that the plan (``plan_at``) still decides alike (the lengths between are then known),
        sought in doubling steps, and where a step leaves the outcome, by halving the last step: the plan's
        outcomes step up with the length and never come back (``tests/test_replay.py`` sweeps it), so a length
        planned alike has every length before it planned alike."""
        if plan_at is None or not self.trusted or n < self.hi:
            return

        def alike(m: int) -> bool:
            try:
                return plan_at(m) == outcome
            except Exception:  # a plan the stand-ins cannot make (a forced variant refusing them): the span ends
                return False
        step = 1
        while step <= self.REACH:
            if not alike(n + step):
                break
            self.hi = n + step
            step *= 2
        else:
            return
        end = n + step  # planned otherwise; every length up to ``hi`` alike
        while end - self.hi > 1:
            mid = (self.hi + end) // 2
            if alike(mid):
                self.hi = mid
            else:
                end = mid

    def replay(self, k, inputs, device, n: int, held: bool | None = None, stream: int | None = None):
        """The outputs of ``at(n)``'s launches over ``inputs``, the recipe kept under ``k``; or None."""
        recipe = self.at(n)
        outputs = recipe.run(inputs, device, held, stream) if recipe is not None else None
        if outputs is not None:
            if len(_RECIPES) >= _MAX_RECIPES:
                _RECIPES.clear()
            _RECIPES[k] = recipe
            self.kept.append(k)
            if len(self.kept) > self.KEPT_LENGTHS:
                _RECIPES.pop(self.kept.popleft(), None)
        return outputs

    def learn(self, n: int, recipe) -> None:
        """Take ``recipe``, recorded at length ``n``: the proof of a candidate launching the same kernels (or its
        end, where it predicts otherwise), else a partner for a waiting recording, else a recording waiting."""
        if not recipe.fast:
            return
        for c in self.candidates:
            if _same_kernels(c.recipe, recipe):
                self.candidates.remove(c)
                if c.predicts(n, recipe):
                    self.trusted = [c, *self.trusted[:self.KEPT - 1]]
                    return
                break
        for t in self.trusted:  # a length the trusted lines know, on other compiled kernels
            line = t.over(n, recipe)
            if line is not None:
                self.trusted = [line, *self.trusted[:self.KEPT - 1]]
                return
        for m, other in self.pending:
            line = _Length.fit(other, m, recipe, n)
            if line is not None:
                self.pending.remove((m, other))
                self.candidates = [line, *self.candidates[:self.KEPT - 1]]
                return
        self.pending = [(n, recipe), *self.pending[:self.KEPT - 1]]


def _same_kernels(ra, rb) -> bool:
    """Whether two recipes' fast launches run the same compiled kernels over the same grids."""
    return len(ra.fast) == len(rb.fast) and all(a.compiled is b.compiled and a.grid == b.grid and a.flags == b.flags
                                                for a, b in zip(ra.fast, rb.fast))


def clear(compiled: bool = True) -> None:
    """Forget every recipe and family (the next call of each kind takes the ordinary path again) and, with
    ``compiled``, the compiled kernels kept for new kinds (their launches go through Triton's JIT again)."""
    _RECIPES.clear()
    _FAMILIES.clear()
    if compiled:
        _COMPILED.clear()
