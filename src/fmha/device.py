"""What fmha knows of the machine: whether Triton's interpreter runs the kernels, and each CUDA
device's compute capability, SM count and L2 size (asked once, not per call)."""
from __future__ import annotations

import contextlib
import functools
import os

import torch


def interpreting() -> bool:
    """True when Triton's CPU interpreter runs the kernels (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=None)
def device_facts(index: int) -> tuple[int, int]:
    """(compute capability major, SM count) of CUDA device ``index``."""
    props = torch.cuda.get_device_properties(index)
    return props.major, props.multi_processor_count


@functools.lru_cache(maxsize=None)
def shared_limit(index: int) -> int:
    """The shared memory one block of CUDA device ``index`` may take, in bytes (227 KB on sm_90, 163 KB on an A100,
    99 KB on sm_86 and sm_89); where torch does not say, the figure of its compute capability."""
    props = torch.cuda.get_device_properties(index)
    return getattr(props, "shared_memory_per_block_optin", None) or shared_of(props.major, props.minor)


def shared_of(major: int, minor: int) -> int:
    """The shared memory one block may take on NVIDIA GPUs of compute capability ``major.minor``, in bytes."""
    return 232448 if major >= 9 else 166912 if (major, minor) in ((8, 0), (8, 7)) else 101376


@functools.lru_cache(maxsize=None)
def l2_bytes(index: int) -> int:
    """The L2 cache's size of CUDA device ``index``, in bytes."""
    return torch.cuda.get_device_properties(index).L2_cache_size


@functools.lru_cache(maxsize=None)
def amd_family(index: int) -> str:
    """``rdna`` (gfx10-12: wave32, WMMA) or ``cdna`` (gfx9: wave64, MFMA) for ROCm device ``index``."""
    return "rdna" if torch.cuda.get_device_properties(index).gcnArchName.startswith("gfx1") else "cdna"


def family_of(device: torch.device) -> str:
    """The backward's tile table for ``device``: interpreter, nvidia (Hopper on), sm80 (NVIDIA before Hopper:
    sm_80, sm_86, sm_89), rdna or cdna."""
    if interpreting():
        return "interpreter"
    if torch.version.hip:
        return amd_family(index_of(device))
    return "sm80" if device_facts(index_of(device))[0] < 9 else "nvidia"


def index_of(device: torch.device) -> int:
    return torch.cuda.current_device() if device.index is None else device.index


def arch_of(device: torch.device) -> str:
    """The config-table key of ``device``: interpreter, sm90, sm80 (other CUDA) or hip."""
    if interpreting():
        return "interpreter"
    if torch.version.hip:
        return "hip"
    major, _ = device_facts(index_of(device))
    return "sm90" if major == 9 else "sm80"


def on(device: torch.device):
    """Make ``device`` current for a launch (a no-op, and cheap, when it already is)."""
    if device.type != "cuda" or index_of(device) == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)
