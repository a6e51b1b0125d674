"""Every bad command line gets one line saying what was wrong and what is accepted, exit status 2,
never a traceback; a CPU run records nothing unless asked; the demo says what its early exit did."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the CPU command line")
ROOT = Path(__file__).resolve().parents[1]


def fmha(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "fmha", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))


@pytest.mark.parametrize("args,says", [
    (("compile", "--variant", "hopper", "--target", "gfx1151"), "variant 'hopper' builds for sm_90 only"),
    (("compile", "--variant", "hopper", "--backward", "--target", "gfx942"), "with --variant hopper --target sm_90"),
    (("plot", "--ledger", "missing.csv"), "--ledger missing.csv: no such file"),
    (("demo", "--row", "100"), "--row 100: the demo's query rows are 0..39"),
    (("bench", "--providers", "fmha:nosuch"), "unknown provider(s) ['fmha:nosuch']; available here:"),
    (("bench", "--where", "head_dim=999"), "selects none of the 3 cells of grid quick; values here:"),
    (("bench", "--where", "colour=1"), "unknown cell field 'colour'"),
    (("bench", "--device", "cpu", "--grid", "default"), "too big for the CPU interpreter"),
    (("sweep", "--variant", "tiled", "--space", "block_q=2"), "--space 'block_q=2'"),
    (("plot", "--run", "nosuchrun", "--out", "{tmp}"), "--run nosuchrun: no such run"),
])
def test_bad_command_lines_say_why_in_one_line(args, says, tmp_path):
    out = fmha(*(a.format(tmp=tmp_path) for a in args))
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr and says in out.stderr, out.stderr[-2000:]
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not list(tmp_path.iterdir())  # nothing drawn


def test_compile_all_builds_the_targets_a_variant_has(tmp_path):
    out = fmha("compile", "--variant", "hopper", "--target", "all", "--head-dim", "64", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "hopper does not build for gfx1151, gfx1100, gfx942, sm_80: skipped" in out.stderr
    assert '"target": "sm_90"' in out.stdout


def test_compile_builds_mla_absorbed_decode_on_tiled():
    out = fmha("compile", "--variant", "tiled", "--target", "sm_90", "--head-dim", "576", "--dtype", "bfloat16",
               "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    assert '"head_dim": 576' in out.stdout
    refused = fmha("compile", "--variant", "hopper", "--target", "sm_90", "--head-dim", "576")
    assert refused.returncode != 0 and "head_dim" in refused.stderr


def test_compile_builds_any_multiple_of_8_on_tiled_and_refuses_what_hopper_lacks_cleanly():
    """tiled builds head_dim 24; hopper takes 32 up, its backward up to 256: below and above (MLA's absorbed 576,
    which only the forward takes), a usage error."""
    out = fmha("compile", "--variant", "tiled", "--target", "sm_90", "--head-dim", "24", "--dtype", "bfloat16",
               "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    assert '"head_dim": 24' in out.stdout
    for head_dim, extra in (("24", ()), ("24", ("--backward",)), ("576", ("--backward",))):
        refused = fmha("compile", "--variant", "hopper", "--target", "sm_90", "--head-dim", head_dim, *extra)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
        assert "head_dim" in refused.stderr


def test_compile_builds_the_gluon_backward():
    """``--backward --variant hopper``: the sm_90 training kernel, reported as any build is (at head_dim 64, in
    128-row tiles, a few registers spill: :func:`test_targets.test_hopper_backward_builds_with_tma_reduce_adds`)."""
    import json
    out = fmha("compile", "--variant", "hopper", "--backward", "--target", "sm_90", "--head-dim", "64", "--dtype",
               "bfloat16", "--causal", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    report = report[0] if isinstance(report, list) else report
    assert report["variant"] == "hopper_backward" and report["target"] == "sm_90" and report["causal"]
    assert 0 <= report["spilled_registers"] <= 32 and report["occupancy"]["warps_per_sm"] == 12
    out = fmha("compile", "--variant", "hopper", "--backward", "--deterministic", "--target", "sm_90", "--head-dim",
               "128", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    report = report[0] if isinstance(report, list) else report
    assert report["config"]["deterministic"] and report["spilled_registers"] <= 512, report
    refused = fmha("compile", "--variant", "tiled", "--deterministic", "--target", "sm_90")
    assert refused.returncode != 0 and "--deterministic names a backward build" in refused.stderr


def test_compile_takes_v_head_dim_apart():
    """``--head-dim-v``: DeepSeek's 192/128 builds, and 40 with V's 24 (V in a 64-column tile); a V wider than q/k
    is refused by name."""
    out = fmha("compile", "--variant", "tiled", "--target", "sm_90", "--head-dim", "192", "--head-dim-v", "128",
               "--dtype", "bfloat16", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    refused = fmha("compile", "--variant", "tiled", "--target", "sm_90", "--head-dim", "128", "--head-dim-v", "256")
    assert refused.returncode != 0 and "head_dim_v" in refused.stderr
    out = fmha("compile", "--variant", "tiled", "--target", "sm_90", "--head-dim", "40", "--head-dim-v", "24",
               "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    assert [i.split(".")[4] for i in json.loads(out.stdout)["matrix_instructions"]] == ["m64n64k16"]  # P V's too


def test_compile_builds_the_backward_with_v_head_dim_apart():
    """``--backward --head-dim-v``: the Gluon backward at DeepSeek's 192/128 (V and dO in 128-wide tiles, two stages)
    and the Triton kernels' (V's tiles 128 wide), each build saying V's head dim; a V the Gluon kernel does not take
    (wider than q/k, or under 32) is refused by name."""
    import json
    out = fmha("compile", "--variant", "hopper", "--backward", "--target", "sm_90", "--head-dim", "192",
               "--head-dim-v", "128", "--causal", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    report = report[0] if isinstance(report, list) else report
    assert report["config"]["head_dim_v"] == 128 and report["config"]["num_stages"] == 2, report["config"]
    out = fmha("compile", "--backward", "--target", "sm_80", "--head-dim", "192", "--head-dim-v", "128", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    reports = json.loads(out.stdout)
    assert reports and all(r["config"]["head_dim_v"] == 128 for r in reports), reports
    for dv in ("192", "24"):  # wider than q/k's; under the Gluon kernel's 32
        refused = fmha("compile", "--variant", "hopper", "--backward", "--target", "sm_90", "--head-dim", "128",
                       "--head-dim-v", dv)
        assert refused.returncode == 2 and f"head_dim_v {dv}" in refused.stderr, refused.stderr[-2000:]
        assert "Traceback" not in refused.stderr


def test_compile_records_a_build_row(tmp_path):
    import csv
    rows_at = tmp_path / "builds.csv"
    out = fmha("compile", "--variant", "singlewave", "--target", "gfx1151", "--head-dim", "64", "--ledger",
               str(rows_at), "--note", "the table")
    assert out.returncode == 0, out.stderr[-2000:]
    (row,) = list(csv.DictReader(rows_at.open(newline="")))
    assert (row["provider"], row["head_dim"], row["dtype"], row["ms"]) == ("build:gfx1151", "64", "float16", "")
    assert row["config"].startswith("singlewave block_m=16 block_n=16 num_warps=1")
    assert row["note"].startswith("the table; vgpr=") and "spilled=0 " in row["note"] and "wmma=8" in row["note"]


def test_a_cpu_bench_records_nothing_unless_asked(tmp_path):
    work = tmp_path / "work"
    (work / "bench").mkdir(parents=True)
    shutil.copy(ROOT / "bench" / "ledger.csv", work / "bench" / "ledger.csv")
    before = (work / "bench" / "ledger.csv").read_bytes()
    out = fmha("bench", "--device", "cpu", "--where", "seqlen_q=16", "--dtype", "float16", "--providers",
               "fmha:tiled", cwd=work)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ledger=none (CPU times mean nothing)" in out.stdout
    assert (work / "bench" / "ledger.csv").read_bytes() == before
    asked = tmp_path / "cpu.csv"
    out = fmha("bench", "--device", "cpu", "--where", "seqlen_q=16", "--dtype", "float16", "--providers",
               "fmha:tiled", "--ledger", str(asked), cwd=work)
    assert out.returncode == 0 and asked.stat().st_size > 0
    # a plot of that ledger refuses its CPU run as "the latest" (its times mean nothing)
    out = fmha("plot", "--ledger", str(asked), "--out", str(tmp_path / "plots"))
    assert out.returncode == 2 and "no benchmark rows measured on a GPU" in out.stderr


def test_demo_says_what_the_early_exit_skipped():
    last = fmha("demo", "--row", "39")  # its block's last row sees the last key: nothing to skip
    assert last.returncode == 0, last.stderr[-2000:]
    assert "ran 4 of 4 key tiles: its block's last row sees the last key" in last.stdout
    assert "skipped the rest" not in last.stdout
    first = fmha("demo", "--row", "0")
    assert "ran 2 of 4 key tiles: the causal early exit skipped the other 2" in first.stdout
