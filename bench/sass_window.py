"""The SASS around the offsets a compute-sanitizer report names, from the kernel's cubin.

`python3 bench/sass_window.py REPORT CUBIN [--context N]`: for each `kernel+0xOFFSET` in REPORT (racecheck,
memcheck), print the instructions from N before to N after it (`cuobjdump -sass`), the named barriers and
shared-memory accesses marked, so a reported hazard can be read against the barrier that orders it.
"""
import argparse
import re
import subprocess
from pathlib import Path

MARK = re.compile(r"\b(BAR\.\w+|BAR\b|SYNCS\.\w+|LDS\S*|STS\S*|LDSM\S*|STSM\S*|ATOMS\S*|WARPSYNC|EXIT|BRA)\b")


def sass(cubin: Path) -> list[tuple[int, str]]:
    out = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*(?:/\*|$)", line)
        if m:
            rows.append((int(m.group(1), 16), m.group(2).strip()))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report")
    ap.add_argument("cubin")
    ap.add_argument("--context", type=int, default=10)
    args = ap.parse_args()
    offsets = sorted({int(x, 16) for x in re.findall(r"\w+\+0x([0-9a-f]+)", Path(args.report).read_text())})
    rows = sass(Path(args.cubin))
    where = {off: i for i, (off, _) in enumerate(rows)}
    barriers = [(off, text) for off, text in rows if text.startswith(("BAR", "@P", "@!P")) and "BAR" in text]
    print(f"{len(rows)} instructions; named barriers: "
          + ", ".join(sorted({re.sub(r'^@!?P\d\s+', '', t) for _, t in barriers})))
    for off in offsets:
        i = where.get(off)
        if i is None:
            print(f"\n0x{off:x}: not an instruction offset")
            continue
        print(f"\n== around 0x{off:x}")
        for o, text in rows[max(0, i - args.context):i + args.context + 1]:
            flag = ">>" if o == off else ("* " if MARK.search(text) else "  ")
            print(f"{flag} {o:06x}  {text}")


if __name__ == "__main__":
    main()
