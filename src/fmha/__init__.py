"""fmha: exact flash-attention kernels (forward and backward) in Triton and Gluon, from the math up."""
from . import custom_op  # noqa: F401  registers torch.ops.fmha.attention for torch.compile
from . import compat  # noqa: F401  FlashAttention's entry points: fmha.compat.flash_attn_func, ...
from .api import attention, attention_paged, attention_varlen, select_variant, variants
from .configs import KernelConfig

__all__ = ["attention", "attention_paged", "attention_varlen", "select_variant", "variants", "KernelConfig"]
__version__ = "0.1.0"
