"""``python -m fmha``: without a CUDA GPU the kernels run in Triton's interpreter."""
import os
import sys

import torch

# `compile` builds for other chips and never runs a kernel: it needs the compiler, not the interpreter
if not torch.cuda.is_available() and sys.argv[1:2] != ["compile"]:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from fmha.cli import main  # noqa: E402

raise SystemExit(main())
