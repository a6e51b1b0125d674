#!/usr/bin/env bash
# Session 14, call 6 (nvidia-h200).  Why chained items lose: Nsight Compute's full set on one call of the table's
# config and of the chained one (with q_ahead), D=128 non-causal bf16 at 1k tokens (B=16, H=16: 8 key tiles an
# item, where the chained boundary cost most) and 16k.  The chained code is commit 44e389f's, carried as an
# untracked copy in old44/ (reverted on main).
set -o pipefail
export PYTHONPATH=old44/src PYTHONUNBUFFERED=1
cat > $OUT/prof.py <<'PY'
import torch, fmha
from fmha.configs import KernelConfig as K
for s in (1024, 16384):
    b = 16384 // s
    q, k, v = (torch.randn(b, 16, s, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    table = fmha.configs.hopper_config(128, False, s)
    import dataclasses
    chained = dataclasses.replace(table, q_regs=1, q_ahead=1, chain=1)
    for cfg in (table, chained):
        fn = lambda: fmha.attention(q, k, v, variant="hopper", config=cfg)
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        print(s, cfg, flush=True)
        torch.cuda.cudart().cudaProfilerStart()
        fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
PY
timeout 240 ncu --profile-from-start off --clock-control none --set full --import-source no \
  -k regex:hopper -o $OUT/prof -f python3 $OUT/prof.py > $OUT/ncu_run.txt 2>&1
tail -6 $OUT/ncu_run.txt
ncu -i $OUT/prof.ncu-rep --page details > $OUT/details.txt 2>&1
grep -E "^  [a-z_]|Duration|SM Frequency|Issue Slots Busy|Executed Ipc A|Stall|Warp Cycles Per Issued|No Eligible|One or More Eligible|Active Warps Per|Eligible Warps" $OUT/details.txt | head -120
ncu -i $OUT/prof.ncu-rep --page raw --csv --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio",gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active > $OUT/raw.csv 2>&1
python3 - $OUT/raw.csv <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = rows[0]
data = [r for r in rows[2:] if len(r) == len(head)]
for j, name in enumerate(head):
    if name.startswith(("smsp__", "gpu__", "sm__")):
        vals = [r[j] for r in data]
        try:
            if max(float(v.replace(",", "")) for v in vals) < 0.05:
                continue
        except ValueError:
            pass
        print(f"{name.replace('smsp__average_warps_issue_stalled_', 'stall_')[:70]:70s}", *vals)
PY
