"""fmha: exact flash-attention forward kernels in Triton, from the math up."""
from .api import attention, select_variant, variants
from .configs import KernelConfig

__all__ = ["attention", "select_variant", "variants", "KernelConfig"]
__version__ = "0.1.0"
