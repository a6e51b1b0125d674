"""A digest of the machine code every table config compiles to: proof that a refactor changed no kernel.

`python3 bench/code_digest.py [--jobs N] > digest.txt` (no GPU needed; run with TRITON_INTERPRET unset) builds,
for sm_90, every row of the `hopper` table (bf16), the per-sequence, paged and ragged-key builds of a causal and
a non-causal row, and the Triton variants at head_dim 64 and 128 for sm_90 and gfx1151, then prints one line per
build: what it is and a hash of its instructions alone (SASS from `cuobjdump -sass` for NVIDIA, the AMDGPU
assembly for AMD), so file names, line numbers and symbol names do not count.  Two runs, before and after a
change, `diff` to nothing when every kernel is the same.
"""
import argparse
import concurrent.futures
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

SASS_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
AMD_LINE = re.compile(r"^\s+([a-z_][a-z0-9_.]*\b.*?)\s*(?:;.*)?$")


def builds() -> list[tuple]:
    from fmha import configs
    todo = [("hopper", "sm_90", d, "bfloat16", causal, cfg, 0, "dense")
            for d, causal, _, cfg in configs.HOPPER]
    for d, causal, _, cfg in configs.HOPPER:
        if d == 128 and _ is None:  # the rows past 16k keys: the other lengths' builds
            todo += [("hopper", "sm_90", d, "bfloat16", causal, cfg, 1000, "dense"),
                     ("hopper", "sm_90", d, "bfloat16", causal, cfg, 0, "varlen"),
                     ("hopper", "sm_90", d, "bfloat16", causal, cfg, 0, "paged")]
    todo += [(v, t, d, "float16", causal, None, 0, "dense") for v in ("singlewave", "pipelined", "tiled")
             for t in ("sm_90", "gfx1151") for d in (64, 128) for causal in (False, True)]
    return todo


def instructions(b) -> str:
    if "cubin" in b.asm:
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(b.asm["cubin"])
            f.flush()
            tool = Path(__import__("triton").__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
            text = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True, check=True).stdout
        return "\n".join(m.group(1) for m in SASS_LINE.finditer(text))
    lines = (AMD_LINE.match(line) for line in b.asm["amdgcn"].splitlines())
    return "\n".join(m.group(1) for m in lines if m and not m.group(1).endswith(":"))


def digest(job) -> str:
    from fmha import targets
    variant, target, d, dtype, causal, cfg, seqlen_k, lengths = job
    b = targets.build(variant, target, d, dtype, causal, config=cfg, seqlen_k=seqlen_k, lengths=lengths)
    code = instructions(b)
    name = f"{variant} {target} D{d} {dtype} {'causal' if causal else 'full'} {lengths}" + \
        (f" Sk{seqlen_k}" if seqlen_k else "") + (f" [{cfg}]" if cfg else "")
    return f"{name}: {len(code.splitlines())} instructions, {hashlib.sha256(code.encode()).hexdigest()[:16]}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        sys.exit("run with TRITON_INTERPRET unset: the builds compile for real targets")
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        for line in pool.map(digest, builds()):
            print(line, flush=True)


if __name__ == "__main__":
    main()
