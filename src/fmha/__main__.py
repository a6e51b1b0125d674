"""``python -m fmha``: without a CUDA GPU the kernels run in Triton's interpreter."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from fmha.cli import main  # noqa: E402

raise SystemExit(main())
