"""A replayed launch sent to the driver from parameters packed once (:mod:`fmha.replay`'s fast path).

Triton's compiled launcher parses every argument of a launch at every call (90-odd for the Gluon kernel: its TMA
descriptors expand into shapes and strides), though a replay changes only the pointers and descriptors. Here a
recorded launch becomes a *plan*, a ``bytearray`` built once (at its first replay): the launch's configuration and
device, then one 16-byte slot a kernel parameter, in the kernel's order (constexprs dropped, as Triton's launcher
drops them), each holding its value or the place of a call's argument that replaces it. A call passes the plan, the
stream, the pointers and the filled descriptors; the C function below points the driver's parameter list at them and
calls ``cuLaunchKernelEx`` with the launch attributes Triton's launcher sets (cooperative grid, programmatic
serialization, cluster size), making the device's primary context current first in a thread that has none, as
Triton's launcher does.

The module is compiled once per machine by Triton's own builder (the C compiler Triton's launchers need), with
Triton's copy of ``cuda.h``; the driver is opened at the first launch, so the module builds and loads without a GPU.
"""
from __future__ import annotations

import functools
import re
import struct

HEADER = struct.Struct("<Q12I")  # function; grid x, y, z; threads, shared memory, CTAs, cooperative, PDL;
# parameters, pointers, descriptors; the device
SLOT = struct.Struct("<iIQ")  # source (-1: the value here, else the call's argument at that place); padding; value
_VALUE = struct.Struct("<Q")  # a slot's value alone
_FIRST_VALUE = HEADER.size + 8  # where the first slot's value lies in a plan
MAX_PARAMS = 512

_SOURCE = r"""
#include "cuda.h"
#include <dlfcn.h>
#include <stdint.h>
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
  PyObject_HEAD;
  _Alignas(128) CUtensorMap tensorMap;
} PyCUtensorMapObject; /* Triton's filled descriptor (triton/backends/nvidia/driver.c) */

typedef struct {
  uint64_t function;
  uint32_t grid[3], threads, shared, ctas, cooperative, pdl, params, pointers, descriptors, device;
} header_t;

typedef struct {
  int32_t source;
  uint32_t unused;
  uint64_t value;
} slot_t;

typedef CUresult (*launch_t)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*error_string_t)(CUresult, const char **);
typedef CUresult (*get_context_t)(CUcontext *);
typedef CUresult (*set_context_t)(CUcontext);
typedef CUresult (*get_device_t)(CUdevice *, int);
typedef CUresult (*retain_t)(CUcontext *, CUdevice);

static launch_t launch_kernel = NULL;
static error_string_t error_string = NULL;
static get_context_t get_context = NULL;
static set_context_t set_context = NULL;
static get_device_t get_device = NULL;
static retain_t retain = NULL;
static PyObject *tensor_map_type = NULL;

static int open_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_LAZY);
  if (!lib) {
    PyErr_SetString(PyExc_RuntimeError, "fmha's launcher: cannot open libcuda.so.1");
    return 0;
  }
  launch_kernel = (launch_t)dlsym(lib, "cuLaunchKernelEx");
  error_string = (error_string_t)dlsym(lib, "cuGetErrorString");
  get_context = (get_context_t)dlsym(lib, "cuCtxGetCurrent");
  set_context = (set_context_t)dlsym(lib, "cuCtxSetCurrent");
  get_device = (get_device_t)dlsym(lib, "cuDeviceGet");
  retain = (retain_t)dlsym(lib, "cuDevicePrimaryCtxRetain");
  if (!launch_kernel || !error_string || !get_context || !set_context || !get_device || !retain) {
    launch_kernel = NULL;
    PyErr_SetString(PyExc_RuntimeError, "fmha's launcher: libcuda.so.1 has no cuLaunchKernelEx");
    return 0;
  }
  return 1;
}

static PyObject *setup(PyObject *self, PyObject *type) {
  Py_XDECREF(tensor_map_type);
  Py_INCREF(type);
  tensor_map_type = type;
  Py_RETURN_NONE;
}

/* launch(plan, stream, *pointers, *descriptors) */
static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs < 2 || !PyByteArray_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "launch(plan: bytearray, stream: int, *pointers, *descriptors)");
    return NULL;
  }
  const char *plan = PyByteArray_AS_STRING(args[0]);
  Py_ssize_t size = PyByteArray_GET_SIZE(args[0]);
  const header_t *h = (const header_t *)plan;
  if (size < (Py_ssize_t)sizeof(header_t) || h->params > MAX_PARAMS ||
      size != (Py_ssize_t)(sizeof(header_t) + h->params * sizeof(slot_t)) ||
      nargs != 2 + (Py_ssize_t)h->pointers + (Py_ssize_t)h->descriptors) {
    PyErr_SetString(PyExc_ValueError, "a plan that does not match its arguments");
    return NULL;
  }
  uint64_t stream = PyLong_AsUnsignedLongLong(args[1]);
  if (PyErr_Occurred()) return NULL;
  uint64_t pointers[MAX_PARAMS];
  void *sources[MAX_PARAMS];
  uint32_t n_sources = h->pointers + h->descriptors;
  if (n_sources > MAX_PARAMS) {
    PyErr_SetString(PyExc_ValueError, "too many arguments");
    return NULL;
  }
  for (uint32_t i = 0; i < h->pointers; i++) {
    pointers[i] = PyLong_AsUnsignedLongLong(args[2 + i]);
    if (PyErr_Occurred()) return NULL;
    sources[i] = &pointers[i];
  }
  for (uint32_t i = h->pointers; i < n_sources; i++) {
    PyObject *d = args[2 + i];
    if (tensor_map_type == NULL || (PyObject *)Py_TYPE(d) != tensor_map_type) {
      PyErr_Format(PyExc_TypeError, "a descriptor must be a PyCUtensorMap, got %s", Py_TYPE(d)->tp_name);
      return NULL;
    }
    sources[i] = &((PyCUtensorMapObject *)d)->tensorMap;
  }
  const slot_t *slots = (const slot_t *)(plan + sizeof(header_t));
  void *params[MAX_PARAMS];
  for (uint32_t i = 0; i < h->params; i++) {
    int32_t s = slots[i].source;
    if (s >= (int32_t)n_sources) {
      PyErr_SetString(PyExc_ValueError, "a slot's source past the arguments");
      return NULL;
    }
    params[i] = s < 0 ? (void *)&slots[i].value : sources[s];
  }
  if ((uint64_t)h->grid[0] * h->grid[1] * h->grid[2] == 0) Py_RETURN_NONE;
  if (launch_kernel == NULL && !open_driver()) return NULL;
  CUcontext context = NULL;
  CUresult status = get_context(&context);
  if (status == CUDA_SUCCESS && context == NULL) { /* a thread with no context yet: the device's primary one */
    CUdevice device;
    status = get_device(&device, (int)h->device);
    if (status == CUDA_SUCCESS) status = retain(&context, device);
    if (status == CUDA_SUCCESS) status = set_context(context);
  }
  CUlaunchAttribute attrs[4];
  unsigned n_attrs = 0;
  if (h->pdl) {
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[n_attrs++].value.programmaticStreamSerializationAllowed = 1;
  }
  if (h->cooperative) {
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[n_attrs++].value.cooperative = 1;
  }
  if (h->ctas != 1) {
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[n_attrs].value.clusterDim.x = h->ctas;
    attrs[n_attrs].value.clusterDim.y = 1;
    attrs[n_attrs++].value.clusterDim.z = 1;
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    attrs[n_attrs++].value.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
  }
  CUlaunchConfig config;
  config.gridDimX = h->grid[0] * h->ctas;
  config.gridDimY = h->grid[1];
  config.gridDimZ = h->grid[2];
  config.blockDimX = h->threads;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = h->shared;
  config.hStream = (CUstream)stream;
  config.attrs = attrs;
  config.numAttrs = n_attrs;
  if (status == CUDA_SUCCESS) {
    Py_BEGIN_ALLOW_THREADS;
    status = launch_kernel(&config, (CUfunction)h->function, params, NULL);
    Py_END_ALLOW_THREADS;
  }
  if (status != CUDA_SUCCESS) {
    const char *what = "unknown error";
    error_string(status, &what);
    PyErr_Format(PyExc_RuntimeError, "Triton Error [CUDA]: %s", what);
    return NULL;
  }
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
  {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "launch(plan, stream, *pointers, *descriptors)"},
  {"setup", setup, METH_O, "setup(the type of Triton's filled descriptors)"},
  {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "fmha_launcher", NULL, -1, methods};

PyMODINIT_FUNC PyInit_fmha_launcher(void) { return PyModule_Create(&module); }
""".replace("MAX_PARAMS", str(MAX_PARAMS))


@functools.cache
def _built():
    """The compiled module (built once per machine into Triton's cache), or why it did not build."""
    from triton.backends.nvidia import driver
    from triton.runtime.build import compile_module_from_src
    try:
        return compile_module_from_src(_SOURCE, "fmha_launcher", include_dirs=driver.include_dirs)
    except Exception as e:  # (no C compiler, a failed build: the replay keeps Triton's own launcher)
        return LookupError(f"fmha's launcher did not build: {e}")


def module():
    """The compiled module; LookupError where it did not build."""
    built = _built()
    if isinstance(built, LookupError):
        raise built
    return built


def sender():
    """``launch(plan, stream, *pointers, *descriptors)``, told the type of Triton's filled descriptors."""
    from triton.backends.nvidia import driver as nvidia
    from triton.runtime import driver
    driver.active.utils  # (loads Triton's C utilities, which define the descriptor type)
    mod = module()
    mod.setup(nvidia.PyCUtensorMap)
    return mod.launch


@functools.lru_cache(maxsize=1024)
def types(compiled) -> tuple:
    """The type of each argument Triton's launcher takes after its fixed ones, in order (a tensor descriptor
    expanded as ``make_launcher`` expands it: the filled CUtensorMap, or the base pointer with shape, strides and
    padding, then shape and strides); read once for each compiled kernel."""
    metas = list(getattr(compiled.metadata, "tensordesc_meta", None) or [])
    out = []
    for ty in compiled.src.signature.values():
        if not isinstance(ty, str):
            raise LookupError(f"an argument of type {ty}")
        if ty.startswith("tensordesc"):
            ndim = re.match(r"tensordesc<[^[>]*\[([^]]*)\]", ty).group(1).count(",") + 1
            meta = metas.pop(0) if metas else None
            out += ["*"] + ["i64"] * (2 * ndim) + ["i1"] if meta is None else ["nvTmaDesc"]
            out += ["i32"] * ndim + ["i64"] * ndim
        else:
            out.append(ty)
    return tuple(out)


_INTS = {"i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64"}
_FLOATS = {"fp16", "bf16", "fp32", "f32", "fp64"}


def _float32(v) -> bytes:
    """``v`` as C's conversion of a double to float gives it (infinite past float's range)."""
    try:
        return struct.pack("<f", v)
    except OverflowError:
        return struct.pack("<f", float("inf") if v > 0 else float("-inf"))


def value(ty: str, v) -> int:
    """A parameter's value as the low bytes of a little-endian 64-bit slot, as Triton's launcher passes it."""
    if ty in _INTS:
        return int(v) & 0xFFFFFFFFFFFFFFFF
    if ty[0] == "*":
        return 0 if v is None else (v if isinstance(v, int) else v.data_ptr())
    if ty in ("fp32", "f32"):
        return struct.unpack("<I", _float32(v))[0]
    if ty == "fp64":
        return struct.unpack("<Q", struct.pack("<d", v))[0]
    if ty == "fp16":
        return struct.unpack("<H", struct.pack("<e", v))[0]
    if ty == "bf16":  # (Triton's launcher truncates float32 to bfloat16)
        return struct.unpack("<I", _float32(v))[0] >> 16
    raise LookupError(f"a parameter of type {ty}")


@functools.lru_cache(maxsize=1024)
def _places(compiled) -> tuple:
    """(the places of the constexprs, of the descriptors, of the pointers, the parameters' count) of
    :func:`types`; LookupError for a type this module does not pack."""
    tys = types(compiled)
    unknown = {ty for ty in tys if ty[0] != "*" and ty not in _INTS | _FLOATS | {"constexpr", "nvTmaDesc"}}
    if unknown:
        raise LookupError(f"a parameter of type {unknown.pop()}")
    constexprs = frozenset(pos for pos, ty in enumerate(tys) if ty == "constexpr")
    descriptors = frozenset(pos for pos, ty in enumerate(tys) if ty == "nvTmaDesc")
    pointers = tuple(pos for pos, ty in enumerate(tys) if ty[0] == "*")
    return constexprs, descriptors, pointers, len(tys) - len(constexprs) + 2


def check(compiled, flat: list, sources: dict) -> None:
    """LookupError where :func:`plan` could not pack this launch (so a replay can keep Triton's launcher)."""
    tys = types(compiled)
    constexprs, descriptors, pointers, n = _places(compiled)
    if len(tys) != len(flat):
        raise LookupError("arguments that do not follow the kernel's signature")
    if compiled.packed_metadata[1] == 16:  # (a non-portable cluster: Triton's launcher sets an attribute for it)
        raise LookupError("a cluster of 16")
    if n > MAX_PARAMS:
        raise LookupError("too many parameters")
    if not constexprs.isdisjoint(sources):
        raise LookupError("a tensor the kernel took as a constant")
    if not descriptors.issubset(sources):
        raise LookupError("a descriptor the call does not fill")
    for pos in pointers:
        v = flat[pos]
        if pos not in sources and v is not None and not isinstance(v, int) and not hasattr(v, "data_ptr"):
            raise LookupError(f"a pointer given as {type(v).__name__}")


def plan(compiled, grid, cooperative: bool, pdl: bool, flat: list, sources: dict,
         device: int = 0) -> tuple[bytearray, dict]:
    """The plan of one launch of ``compiled`` over ``grid`` with ``flat`` (Triton's launcher's arguments after its
    fixed ones), where ``sources`` maps a place in ``flat`` to the place of the call's argument that fills it
    (pointers first, then descriptors); ``device``: the kernel's (its primary context is
    made current in a thread that has none).  Returns the plan and {place in ``flat``: its slot}, for
    :func:`patch`; LookupError as :func:`check` says."""
    check(compiled, flat, sources)
    tys = types(compiled)
    num_warps, ctas, shared = compiled.packed_metadata
    fields, at = [], {}  # each slot's source, padding and value, in turn
    for pos, ty in enumerate(tys):
        if ty == "constexpr":
            continue
        at[pos] = len(at)
        if pos in sources:
            fields += (sources[pos], 0, 0)
        else:
            v = flat[pos]
            fields += (-1, 0, value(ty, v))
    fields += (-1, 0, 0, -1, 0, 0)  # global and profile scratch: none
    n = len(fields) // 3
    n_desc = sum(tys[pos] == "nvTmaDesc" for pos in sources)
    out = bytearray(HEADER.pack(compiled.function, *grid, 32 * num_warps, shared, ctas, int(cooperative), int(pdl),
                                n, len(sources) - n_desc, n_desc, device))
    return out + struct.pack("<" + "iIQ" * n, *fields), at


def value_places(tys: list, at: dict, positions) -> list:
    """Where the values of the integer parameters at ``positions`` (places in ``flat``) lie in a plan seen as 64-bit
    words (:func:`with_values`), None for one the plan has no slot for (a 1, which the kernel took as a constant);
    ``tys``: :func:`types`, ``at``: :func:`plan`'s.  LookupError for a parameter that is not an integer."""
    places = []
    for pos in positions:
        if pos not in at:
            places.append(None)
        elif tys[pos] not in _INTS:
            raise LookupError(f"a moving parameter of type {tys[pos]}")
        else:
            places.append((_FIRST_VALUE + SLOT.size * at[pos]) // _VALUE.size)
    return places


def with_values(plan_: bytearray, places, values) -> bytearray:
    """A copy of ``plan_`` with the integers ``values`` at ``places`` (:func:`value_places`; only a value changes:
    each slot's source and padding stay)."""
    out = bytearray(plan_)
    words = memoryview(out).cast("Q")
    for at, v in zip(places, values):
        words[at] = v & 0xFFFFFFFFFFFFFFFF
    words.release()
    return out
