"""The campaign tools on the CPU: ledger rows, FLOP counts, a failing provider, plots."""
import itertools
import os
import subprocess
import sys
import time

import numpy as np

import pytest
import torch

from fmha import reference
from fmha.bench import grids, ledger, plot, providers, report, runner
from fmha.bench.flops import attention_flops, visible_pairs
from fmha.bench.providers import Provider

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU campaign tests")


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_causal_flops_match_a_brute_force_count(align):
    for sq, sk in itertools.product([1, 2, 7, 16, 33, 100], [1, 5, 16, 64, 101]):
        brute = int(sum(1 for i in range(sq) for j in range(sk) if j <= i + (0 if align == "top_left" else sk - sq)))
        assert visible_pairs(sq, sk, True, align) == brute == reference.visible(sq, sk, True, align).sum()
    assert attention_flops(2, 3, 10, 10, 64, True) == 4 * 2 * 3 * 55 * 64
    assert attention_flops(2, 3, 10, 12, 64, False) == 4 * 2 * 3 * 120 * 64


def test_bench_cli_writes_complete_rows(tmp_path):
    path = tmp_path / "ledger.csv"
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    out = subprocess.run([sys.executable, "-m", "fmha", "bench", "--device", "cpu", "--grid", "quick",
                          "--dtype", "float16", "--ledger", str(path)], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "times above mean nothing" in out.stdout
    rows = ledger.read(path)
    assert list(rows[0]) == ledger.COLUMNS
    bench_rows = [r for r in rows if not r["provider"].startswith("ceiling:")]
    n_prov = len(providers.providers("cpu"))
    assert len(bench_rows) == len(grids.quick_grid()) * n_prov
    for r in bench_rows:
        assert r["note"] == "ok", r
        filled = [c for c in ledger.COLUMNS if c != "features"]  # "": a cell without modifiers
        assert all(r[c] != "" for c in filled), {c: r[c] for c in filled if r[c] == ""}
        flops = attention_flops(int(r["batch"]), int(r["heads"]), int(r["seqlen_q"]), int(r["seqlen_k"]),
                                int(r["head_dim"]), bool(int(r["causal"])))
        assert float(r["tflops"]) == pytest.approx(flops / (float(r["ms"]) * 1e-3) / 1e12, rel=1e-3)
        assert float(r["error"]) < 1e-2
        if r["provider"].startswith("fmha:"):  # what ran: the variant (auto: the one it picked) and its tiles
            variant, tiles = r["config"].split()[0], r["config"].split()[1:3]
            assert variant == (r["provider"][5:] if r["provider"] != "fmha:auto" else "tiled"), r["config"]
            assert tiles[0].startswith("block_m=") and tiles[1].startswith("block_n="), r["config"]
    # appending never rewrites: a second run adds rows after the first
    before = path.read_text()
    ledger.append(path, [{"provider": "x", "note": "appended"}])
    assert path.read_text().startswith(before)


@pytest.mark.parametrize("causal,align", [(True, "top_left"), (True, "bottom_right"), (False, "top_left")])
def test_window_flops_match_the_reference_band(causal, align):
    for sq, sk, w in itertools.product([1, 7, 33], [5, 33, 64], [0, 3, 40]):
        band = reference.visible(sq, sk, causal, align, (w, -1)).sum()
        assert visible_pairs(sq, sk, causal, align, window=w) == band


def test_modifier_cells_are_checked_and_named():
    """A features cell: fmha and SDPA (an explicit mask) against the float64 reference, the
    ``features`` column filled, SDPA skipped where it has no softcap, a table column for them."""
    provs = [p for p in providers.providers("cpu") if p.name in ("fmha:tiled", "sdpa:math")]
    rows = []
    for cell in (grids.Cell(1, 2, 1, 24, 40, 32, True, window=6, alibi=1),
                 grids.Cell(1, 2, 2, 24, 24, 32, True, window=6, softcap=5)):
        rows += runner.run_cell(cell, torch.float16, provs, "cpu", peak=1.0)
    notes = {(r["provider"], r["features"]): r["note"] for r in rows}
    assert notes[("fmha:tiled", "window=6 alibi")] == "ok" and notes[("sdpa:math", "window=6 alibi")] == "ok"
    assert notes[("fmha:tiled", "window=6 softcap=5")] == "ok"
    assert "no softcap" in notes[("sdpa:math", "window=6 softcap=5")]
    assert all(r["error"] < 1e-2 for r in rows if r["note"] == "ok")
    assert all(r["config"].startswith("tiled block_m=") for r in rows if r["provider"] == "fmha:tiled")  # what ran
    table = report.grid_table(rows, focus="fmha:tiled")
    assert "features" in table.splitlines()[0] and "window=6 alibi" in table


def test_dropout_cells_hold_each_provider_to_what_one_draw_of_dropped_pairs_gives():
    """A dropout cell: fmha and SDPA draw their pairs, each output and each gradient is held to the error one draw
    gives against the reference's expectation (``sqrt(p / (1 - p))``), a provider that drops nothing fails, the
    ``features`` column and the config name the dropout, and the grid holds such cells."""
    cell = grids.Cell(1, 4, 2, 48, 48, 32, True, dropout=0.2)
    keep = lambda q, k, v, c: (lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
        q, k, v, is_causal=True, enable_gqa=True))
    provs = [p for p in providers.providers("cpu") if p.name in ("fmha:tiled", "sdpa:math")]
    for pass_ in ("fwd", "bwd"):
        rows = runner.run_cell(cell, torch.float16, provs + [Provider("undropped", keep, False)], "cpu", 1.0,
                               pass_=pass_)
        by = {r["provider"]: r for r in rows}
        for name in ("fmha:tiled", "sdpa:math"):
            assert by[name]["note"] == "ok" and by[name]["features"] == "dropout=0.2", by[name]
            assert 0.5 / 1.5 < by[name]["error"] < 0.5 * 1.5, by[name]  # sqrt(0.2 / 0.8) = 0.5
        assert by["undropped"]["note"].startswith("failed: RuntimeError: wrong"), by["undropped"]
    assert "triton backward" in by["fmha:tiled"]["config"], by["fmha:tiled"]["config"]
    drops = grids.where(grids.dropout_grid(), "dropout=0.1 head_dim=128 causal=1")
    assert drops and all(c.dropout == 0.1 and c.features == "dropout=0.1" for c in drops)


def test_layout_cells_run_the_same_values_in_their_own_strides():
    """A models-grid cell in each layout: q, k, v hold the cell's values in that layout's strides, every
    provider is checked on them, and the ``features`` column names the layout."""
    provs = [p for p in providers.providers("cpu") if p.name in ("fmha:tiled", "sdpa:math")]
    base = grids.Cell(1, 4, 2, 24, 24, 32, True)
    q0, k0, v0, *_ = runner.cell_inputs(base, torch.float16, "cpu")
    for layout in ("hf-view", "fused-qkv", "kv-cache"):
        cell = grids.Cell(1, 4, 2, 24, 24, 32, True, layout=layout)
        q, k, v, *_ = runner.cell_inputs(cell, torch.float16, "cpu")
        assert all(torch.equal(a, b) for a, b in ((q, q0), (k, k0), (v, v0)))
        assert (q.stride(), k.stride()) != (q0.stride(), k0.stride())
        rows = runner.run_cell(cell, torch.float16, provs, "cpu", peak=1.0)
        assert {r["features"] for r in rows} == {f"layout={layout}"}
        assert all(r["note"] == "ok" for r in rows), rows
    models = grids.where(grids.models_grid(), "layout=fused-qkv heads=28")
    assert models and all(c.layout == "fused-qkv" and c.kv_heads == 4 for c in models)


def test_backward_pass_cells_check_gradients_and_count_their_flops():
    """``--pass bwd`` and ``fwd+bwd``: each provider's gradients checked against float32 autograd before
    it is timed, TFLOP/s over 2.5 or 3.5 times the forward's FLOPs, the ``pass`` column filled; a provider
    whose output carries no gradient is recorded as failed."""
    cell = grids.Cell(1, 2, 1, 17, 40, 64, True)
    detached = providers.Provider("detached", lambda q, k, v, c: (lambda: q.detach() * 1.0), peer=True)
    provs = [p for p in providers.providers("cpu") if p.name in ("fmha:auto", "sdpa:math")] + [detached]
    for pass_, factor in (("bwd", 2.5), ("fwd+bwd", 3.5)):
        rows = runner.run_cell(cell, torch.bfloat16, provs, "cpu", peak=1.0, pass_=pass_)
        by = {r["provider"]: r for r in rows}
        assert {r["pass"] for r in rows} == {pass_}
        for name in ("fmha:auto", "sdpa:math"):
            assert by[name]["note"] == "ok" and by[name]["error"] < 2e-2, by[name]
            flops = factor * attention_flops(1, 2, 17, 40, 64, True)
            assert by[name]["tflops"] == pytest.approx(flops / (by[name]["ms"] * 1e-3) / 1e12, rel=1e-3)
        assert by["detached"]["note"].startswith("failed"), by["detached"]
        assert "; triton backward dK/dV 16x16" in by["fmha:auto"]["config"], by["fmha:auto"]["config"]
    window = grids.Cell(1, 2, 2, 24, 24, 32, True, window=4)  # the reference's gradients from SDPA given the band
    rows = runner.run_cell(window, torch.float16, provs[:2], "cpu", 1.0, pass_="bwd")
    assert all(r["note"] == "ok" and r["error"] < 2e-2 and r["features"] == "window=4" for r in rows), rows
    with pytest.raises(ValueError, match="without softcap"):
        runner.run_cell(grids.Cell(1, 2, 2, 16, 16, 32, True, softcap=5.0), torch.float16, provs, "cpu", 1.0,
                        pass_="bwd")


def test_the_triton_backward_provider_holds_every_backward_to_the_triton_kernels(monkeypatch):
    """``fmha:triton-backward``: auto's forward, and its backward with the Gluon kernel's rows rules emptied
    while each of its calls runs (checked and timed alike, its config named too), the rules restored after."""
    from fmha import backward
    rules, real, seen = backward.GLUON_ROWS, backward.kernel, []

    def spy(*args, **kw):
        seen.append(backward.GLUON_ROWS)
        return real(*args, **kw)
    monkeypatch.setattr(backward, "kernel", spy)
    prov, = providers.select(providers.providers("cpu"), ["fmha:triton-backward"])
    rows = runner.run_cell(grids.Cell(1, 2, 1, 17, 40, 64, True), torch.bfloat16, [prov], "cpu", 1.0, pass_="bwd")
    assert rows[0]["note"] == "ok" and "; triton backward" in rows[0]["config"], rows[0]
    assert len(seen) >= 3 and all(r is providers.NO_GLUON_ROWS for r in seen), seen
    assert backward.GLUON_ROWS is rules


def test_backward_under_cuda_graphs_times_both_passes_less_the_forward():
    """With ``graphs``, ``bwd`` is timed as a pair (forward and backward, forward alone: autograd's backward
    alone cannot be captured) whose first member computes the gradients and whose time is the difference; a
    provider whose backward breaks captures (FlashAttention-4's) is recorded as failed without being run."""
    cell = grids.Cell(1, 2, 1, 17, 40, 64, True)
    prov = next(p for p in providers.providers("cpu") if p.name == "fmha:auto")
    q, k, v, ref, _ = runner.cell_inputs(cell, torch.bfloat16, "cpu")
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    do = torch.randn(ref.shape, dtype=torch.bfloat16)
    ref_grads = runner._reference_grads(q, k, v, do, cell)
    (both, fwd), err = runner._checked(prov, q, k, v, cell, ref, "bwd", do, ref_grads, graphs=True)
    assert err < 2e-2
    grads = both()
    assert len(grads) == 3 and all(g.shape == t.shape for g, t in zip(grads, (q, k, v)))
    assert fwd().shape == ref.shape
    ms = runner.time_ms((lambda: time.sleep(0.05), lambda: None), "cpu")
    assert 45 < ms < 500, ms

    def never(q, k, v, c):
        raise AssertionError("a provider whose backward cannot be captured is not run under --cuda-graphs")
    uncapturable = Provider("uncapturable", never, peer=True, graph_backward=False)
    rows = runner.run_cell(cell, torch.bfloat16, [prov, uncapturable], "cpu", 1.0, graphs=True, pass_="bwd")
    by = {r["provider"]: r for r in rows}
    assert by["fmha:auto"]["note"] == "ok, cuda graph (fwd+bwd less fwd)", by["fmha:auto"]
    assert by["uncapturable"]["note"].startswith("failed: its backward cannot be captured"), by["uncapturable"]


def test_mla_cells_run_with_v_head_dim_other_than_qk():
    """An MLA cell (q/k 192, v 128): v drawn with its own head dim, outputs checked, FLOPs over both dims,
    the features column naming it."""
    provs = [p for p in providers.providers("cpu") if p.name in ("fmha:auto", "sdpa:math")]
    cell = grids.Cell(1, 2, 2, 24, 24, 192, True, head_dim_v=128)
    q, k, v, ref, flops = runner.cell_inputs(cell, torch.bfloat16, "cpu")
    assert v.shape[-1] == 128 and ref.shape[-1] == 128 and flops == 2 * 2 * 300 * (192 + 128)
    rows = runner.run_cell(cell, torch.bfloat16, provs, "cpu", peak=1.0)
    assert all(r["note"] == "ok" and r["features"] == "head_dim_v=128" for r in rows), rows
    assert all(c.head_dim == 192 and c.head_dim_v == 128 for c in grids.mla_grid())


def test_mla_decode_cells_read_v_from_the_latent():
    """``--grid mla-decode``: MLA's absorbed form, V k's first 512 columns (the ``latent`` layout), fmha
    checked against the reference of those values."""
    provs = [p for p in providers.providers("cpu") if p.name == "fmha:auto"]
    cell = grids.Cell(1, 4, 1, 1, 40, 576, False, layout="latent", head_dim_v=512)
    q, k, v, ref, _ = runner.cell_inputs(cell, torch.bfloat16, "cpu")
    assert v.data_ptr() == k.data_ptr() and v.shape[-1] == 512 and ref.shape[-1] == 512
    rows = runner.run_cell(cell, torch.bfloat16, provs, "cpu", peak=1.0)
    assert all(r["note"] == "ok" for r in rows), rows
    cells = grids.GRIDS["mla-decode"]()
    assert all((c.head_dim, c.head_dim_v, c.kv_heads, c.seqlen_q, c.layout) == (576, 512, 1, 1, "latent")
               for c in cells)


def test_head_dims_grid_holds_the_other_head_dims():
    """``--grid head-dims``: 32, 80, 96 and 256 as the default grid holds 64 and 128 (B*S = 16k, heads * D
    about 2048), causal and not."""
    cells = grids.GRIDS["head-dims"]()
    assert sorted({c.head_dim for c in cells}) == [32, 80, 96, 256] and {c.causal for c in cells} == {False, True}
    assert all(c.batch * c.seqlen_q == 16384 and 2048 - c.head_dim < c.heads * c.head_dim <= 2048 for c in cells)


def test_a_ledger_from_before_a_new_column_takes_the_longer_header(tmp_path):
    path = tmp_path / "ledger.csv"
    old = ledger.COLUMNS[:-1]
    path.write_text(",".join(old) + "\r\n" + ",".join("x" for _ in old) + "\r\n")
    ledger.append(path, [{"provider": "new", "features": "window=8", "pass": "bwd"}])
    rows = ledger.read(path)
    assert list(rows[0]) == ledger.COLUMNS
    assert rows[0]["features"] == "x" and not rows[0]["pass"]
    assert rows[1]["provider"] == "new" and rows[1]["features"] == "window=8" and rows[1]["pass"] == "bwd"


def test_a_failing_provider_does_not_stop_the_run():
    def broken(q, k, v, cell):
        raise RuntimeError("out of shared memory (simulated)")

    def wrong(q, k, v, cell):
        return lambda: torch.zeros_like(q)

    good = providers.providers("cpu")[:1]
    provs = [Provider("broken", broken, False), Provider("wrong", wrong, False), *good,
             Provider("sdpa:math", providers.providers("cpu")[-1].make, True)]
    rows = runner.run_cell(grids.Cell(1, 1, 1, 17, 17, 32, True), torch.float16, provs, "cpu", peak=1.0)
    notes = {r["provider"]: r["note"] for r in rows}
    assert notes["broken"].startswith("failed: RuntimeError: out of shared memory")
    assert notes["wrong"].startswith("failed: RuntimeError: wrong result")
    assert notes["fmha:auto"] == "ok" and notes["sdpa:math"] == "ok"
    auto = next(r for r in rows if r["provider"] == "fmha:auto")
    math_ms = next(r for r in rows if r["provider"] == "sdpa:math")["ms"]
    assert auto["ratio_best_peer"] == pytest.approx(math_ms / auto["ms"])


def test_plot_turns_a_ledger_into_pngs(tmp_path):
    path = tmp_path / "ledger.csv"
    env = {"timestamp": "t", "run_id": "r1", "git_sha": "s", "gpu": "fake", "torch": "t", "triton": "t"}
    rows = [dict(env, provider="ceiling:matmul", tflops=700, ms=1, note="matmul ceiling"),
            dict(env, provider="ceiling:copy", tbps=4.0, ms=1, note="copy ceiling")]
    for p, d, c, s in itertools.product(["fmha:auto", "sdpa:cudnn"], [64, 128], [0, 1], [512, 1024, 2048]):
        rows.append(dict(env, provider=p, dtype="bfloat16", batch=1, heads=16, kv_heads=16, seqlen_q=s,
                         seqlen_k=s, head_dim=d, causal=c, ms=1.0, tflops=100 + s / 10, tbps=0.5,
                         ratio_best_peer=1.0, error=1e-3, note="ok"))
    ledger.append(path, rows)
    paths = plot.plot(path, tmp_path / "plots")
    assert {p.name for p in paths} == {"tflops_bfloat16.png", "ratio_best_peer_bfloat16.png", "roofline.png"}
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


def test_plot_gives_each_provider_one_color_in_every_panel(tmp_path):
    """A peer that failed in one panel (its row without a time) takes no line there, and the other providers keep
    their colors: one color a provider over the run, and the legend names every provider drawn in any panel."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    env = {"timestamp": "t", "run_id": "r1", "git_sha": "s", "gpu": "fake", "torch": "t", "triton": "t"}
    rows = []
    for p, d, s in itertools.product(["flash_attn.cute", "fmha:auto", "sdpa:cudnn"], [80, 96], [1024, 4096]):
        failed = p == "flash_attn.cute" and d == 80
        rows.append(dict(env, provider=p, dtype="bfloat16", batch=1, heads=16, kv_heads=16, seqlen_q=s, seqlen_k=s,
                         head_dim=d, causal=0, ms="" if failed else 1.0, tflops="" if failed else 100 + s / 100,
                         ratio_best_peer=1.0, note="failed: wrong gradients" if failed else "ok"))
    assert plot.colors(rows) == {"flash_attn.cute": "C0", "fmha:auto": "C1", "sdpa:cudnn": "C2"}
    path = tmp_path / "ledger.csv"
    ledger.append(path, rows)
    drawn = []
    save = plt.Figure.savefig

    def keep(fig, *args, **kw):
        drawn.append({ax.get_title(): {line.get_label(): line.get_color() for line in ax.get_lines()}
                      for ax in fig.axes})
        legend = fig.axes[0].get_legend()
        drawn[-1]["legend"] = [t.get_text() for t in legend.get_texts()] if legend else []
        return save(fig, *args, **kw)
    plt.Figure.savefig = keep
    try:
        plot.plot(path, tmp_path / "plots")
    finally:
        plt.Figure.savefig = save
    tflops = drawn[0]
    assert tflops["D=80 non-causal"] == {"fmha:auto": "C1", "sdpa:cudnn": "C2"}
    assert tflops["D=96 non-causal"] == {"flash_attn.cute": "C0", "fmha:auto": "C1", "sdpa:cudnn": "C2"}
    assert tflops["legend"] == ["flash_attn.cute", "fmha:auto", "sdpa:cudnn"]


def test_plot_panels_split_decoding_by_query_rows():
    """The default grid (seqlen_q = seqlen_k) plots one panel per (head_dim, causal); the decode grid
    (seqlen_q 1, 4, 16 against the same keys) one per seqlen_q, so no line joins different query counts."""
    def row(c):
        return {"head_dim": c.head_dim, "causal": int(c.causal), "seqlen_q": c.seqlen_q, "seqlen_k": c.seqlen_k}
    assert sorted({plot.panel(row(c)) for c in grids.default_grid()}) == [(64, 0, 0), (64, 1, 0), (128, 0, 0),
                                                                         (128, 1, 0)]
    assert sorted({plot.panel(row(c)) for c in grids.decode_grid()}) == [(128, 0, 1), (128, 0, 4), (128, 0, 16)]


def test_sweep_records_failures(tmp_path):
    from fmha.bench import sweep
    space = sweep.parse_space("block_m=16 block_n=16 num_warps=1 num_stages=1", "singlewave")
    rows = sweep.sweep("singlewave", space, [grids.Cell(1, 1, 1, 20, 20, 32, False)], torch.float16, "cpu",
                       tmp_path / "l.csv", show_progress=False)
    assert [r["note"] for r in rows] == ["sweep ok"]
    with pytest.raises(ValueError, match="unknown config field"):
        sweep.parse_space("tile=3", "tiled")
    assert sweep.parse_space("split_per_sm=2,8", "tiled")["split_per_sm"] == [2, 8]
    np.testing.assert_equal(len(ledger.read(tmp_path / "l.csv")), 3)  # two ceilings + one attempt


def test_grid_table_counts_the_cells_at_or_above_sdpa():
    from fmha.bench import report
    base = {"dtype": "float16", "batch": 1, "heads": 2, "kv_heads": 2, "seqlen_k": 64, "head_dim": 64, "causal": 0}
    rows = []
    for sq, ours, theirs in ((64, 1.0, 1.2), (128, 2.0, 1.0)):
        rows.append(dict(base, seqlen_q=sq, provider="fmha:auto", ms=ours, tflops=1.0, error=1e-3))
        rows.append(dict(base, seqlen_q=sq, provider="sdpa:cudnn", ms=theirs, tflops=1.0))
    last = report.grid_table(rows).splitlines()[-1]
    assert last == "fmha:auto >= 1.0x the best SDPA backend in 1 of 2 cells (ratios 0.50-1.20)."


def test_fa4_goal_line_is_the_geometric_mean_over_its_shapes():
    from fmha.bench import published, report

    def row(dtype, b, h, s, d, causal, tflops, provider="fmha:auto", kv=None):
        return dict(provider=provider, dtype=dtype, batch=b, heads=h, kv_heads=kv or h, seqlen_q=s, seqlen_k=s,
                    head_dim=d, causal=int(causal), ms=1.0, tflops=tflops, error=1e-3)
    rows = [row("bfloat16", 1, 16, 16384, 128, False, 2 * 668), row("float16", 4, 32, 4096, 64, True, 4 * 401),
            row("bfloat16", 4, 16, 4096, 128, True, 0.25 * 566),
            row("bfloat16", 4, 32, 4096, 128, False, 999, kv=8),        # GQA: not a BENCH.md shape
            row("bfloat16", 1, 16, 16384, 128, True, 1.0, provider="sdpa:cudnn")]
    geo, n, within = published.fa4_geomean(rows)
    assert n == 2 and abs(geo - (2 * 0.25) ** 0.5) < 1e-9  # the fp16 D=64 causal shape is not in BENCH.md
    assert within is None  # no cuDNN row at those shapes
    assert published.fa4_geomean(rows[3:]) is None
    assert report.grid_table(rows).splitlines()[-1].endswith("(another run, 2 shapes): geometric mean 0.707x.")
    # with cuDNN in the same run: ours/cuDNN here over FA4/cuDNN in BENCH.md (668/603 at the first shape)
    rows.append(row("bfloat16", 1, 16, 16384, 128, False, 2 * 668 / 1.25, provider="sdpa:cudnn"))
    geo, n, within = published.fa4_geomean(rows)
    assert n == 2 and abs(within - 1.25 / (668 / 603)) < 1e-9
    assert report.grid_table(rows).splitlines()[-1].endswith(
        "geometric mean 0.707x; each run against its own cuDNN (fmha:auto/cuDNN here over FA4/cuDNN there): 1.128x.")


def test_where_keeps_the_named_cells():
    assert all(c.seqlen_k % 128 for c in grids.ragged_grid())  # every sequence ends inside a key tile
    cells = grids.decode_grid() + grids.default_grid()
    kept = grids.where(cells, "seqlen_q=1,4 causal=0")
    assert kept and all(c.seqlen_q in (1, 4) and not c.causal for c in kept)
    assert len(kept) == sum(1 for c in cells if c.seqlen_q in (1, 4) and not c.causal)
    assert grids.where(cells, None) == cells
    with pytest.raises(ValueError, match="unknown cell field"):
        grids.where(cells, "dim=3")


def test_sweep_cli_over_a_grid(tmp_path):
    path = tmp_path / "ledger.csv"
    out = subprocess.run([sys.executable, "-m", "fmha", "sweep", "--variant", "tiled", "--grid", "quick",
                          "--space", "block_m=16 block_n=16 num_warps=4 num_stages=1", "--ledger", str(path)],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore"), timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [r for r in ledger.read(path) if r["provider"] == "fmha:tiled"]
    assert len(rows) == len(grids.quick_grid()) and all(r["note"] == "sweep ok" for r in rows)
    assert out.stdout.count("best B=") == len(grids.quick_grid())


def test_hopper_provider_with_changed_fields():
    """``fmha:hopper[field=value,...]`` runs each cell's own HOPPER table entry with those fields
    replaced (and says so in the ledger's config column), ``fmha:tiled[...]`` its table's; unknown
    fields and values are refused, and each is offered only where its variant is."""
    from fmha import configs
    fake_hopper = [Provider("fmha:hopper", lambda *a: None, peer=False)]
    (p,) = providers.select(fake_hopper, ["fmha:hopper[persistent=0,pingpong=1]"])
    for cell in (grids.Cell(16, 32, 32, 1024, 1024, 64, False), grids.Cell(1, 16, 16, 16384, 16384, 128, True)):
        table = configs.hopper_config(cell.head_dim, cell.causal, cell.seqlen_k)
        assert p.config(cell) == configs.KernelConfig(**{**table.as_dict(), "persistent": 0, "pingpong": 1})
        assert runner._config_of(p, cell, None, None, None) == str(p.config(cell))
    (t,) = providers.select(providers.providers("cpu"), ["fmha:tiled[tma=1]"])  # decoding: the decode table's
    cell = grids.Cell(4, 32, 8, 1, 8192, 128, False)
    assert t.config(cell) == configs.KernelConfig(**{**configs.decode_config(4, 8192).as_dict(), "tma": 1})
    for bad in ("fmha:hopper[pingpong=x]", "fmha:hopper[nope=1]"):
        with pytest.raises(ValueError, match="field=integer"):
            providers.select(fake_hopper, [bad])
    # the same parser serves bench/power_probe.py and bench/ncu_profile.py
    assert providers.config_changes("persistent=0,pingpong=1") == {"persistent": 0, "pingpong": 1}
    with pytest.raises(ValueError, match="field=integer"):
        providers.config_changes("block_m=64,lazy")
    with pytest.raises(ValueError, match="unknown provider"):
        providers.select(providers.providers("cpu"), ["fmha:hopper[pingpong=1]"])


def test_the_deterministic_backward_is_a_provider_by_name(monkeypatch):
    """``fmha:deterministic`` (asked for by name, not in the default list) calls fmha with deterministic=True."""
    assert "fmha:deterministic" not in [p.name for p in providers.providers("cpu")]
    (p,) = providers.select(providers.providers("cpu"), ["fmha:deterministic"])
    seen = []
    monkeypatch.setattr(providers.fmha, "attention", lambda *a, **kw: seen.append(kw))
    x = torch.zeros(1)
    p.make(x, x, x, grids.Cell(1, 2, 2, 16, 16, 64, True))()
    assert p.name == "fmha:deterministic" and seen[0]["deterministic"] is True and seen[0]["variant"] == "auto"


def test_run_tag_keeps_streams_of_one_second_apart(monkeypatch):
    monkeypatch.setenv("FMHA_GIT_SHA", "abc1234")
    monkeypatch.delenv("FMHA_RUN_TAG", raising=False)
    plain = ledger.environment("cpu")
    monkeypatch.setenv("FMHA_RUN_TAG", "gpu1")
    tagged = ledger.environment("cpu")
    assert plain["git_sha"] == tagged["git_sha"] == "abc1234"
    assert tagged["run_id"].endswith("-gpu1") and tagged["run_id"][:15].isascii()
    assert plain["run_id"] == plain["timestamp"][:19].replace("-", "").replace(":", "").replace("+", "")[:15]


def test_a_bench_scripts_cell_ranks_against_its_peers_and_says_what_was_skipped(capsys):
    """``report.measured`` and ``report.cell_lines`` (bench/varlen_speed.py's and bench/paged_speed.py's cells): each
    provider timed by ``one``, a refusal's reason and a raised error kept as why it was skipped, the ratio taken
    against the fastest peer only, the error printed beside it."""
    def boom():
        raise RuntimeError("no  kernel\nfor this")
    named = {"fmha:auto": lambda: 2.0, "sdpa:flash": lambda: 4.0, "sdpa:cudnn": lambda: 3.0,
             "flash_attn": "not installed", "sdpa:math": boom}
    results = report.measured(named, lambda name, fn: (fn(), 1e-3))
    assert results["flash_attn"] == (None, "not installed")
    assert results["sdpa:math"] == (None, "RuntimeError: no kernel for this")
    timed = report.cell_lines("32/8   128", results, 6e9, lambda n: n.startswith("sdpa"), width=12)
    assert [(n, ms, round(tf, 3), round(r, 3)) for n, ms, tf, r, _ in timed] == [
        ("fmha:auto", 2.0, 3.0, 1.5), ("sdpa:flash", 4.0, 1.5, 0.75), ("sdpa:cudnn", 3.0, 2.0, 1.0)]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["32/8", "128", "fmha:auto", "2.000", "3.0", "1.500", "1.0e-03"]
    assert lines[3] == "32/8   128 flash_attn   skipped: not installed"
    assert lines[4].endswith("skipped: RuntimeError: no kernel for this")
    assert np.isnan(report.cell_lines("x", {"fmha:auto": (1.0, 0.0)}, 1e9, lambda n: False)[0][3])  # no peer


def test_a_gpu_times_each_provider_twice_the_second_round_reversed(monkeypatch):
    """On a GPU each provider's time is the better of two medians, taken in two rounds over the providers, the
    second in reverse order (so none always runs first, at the GPU's coolest); a provider whose timing fails keeps
    its failure and no time, and is not timed again; elsewhere one round."""
    calls = []
    times = {"a": [3.0, 2.0], "b": [1.0, 4.0], "c": [RuntimeError("not capturable")]}

    def fake(fn, device, graphs=False):
        calls.append(fn)
        t = times[fn].pop(0)
        if isinstance(t, Exception):
            raise t
        return t
    monkeypatch.setattr(runner, "time_ms", fake)
    rows = [{"provider": n} for n in "abc"]
    ticks = []
    out = runner.time_in_rounds([(r, r["provider"]) for r in rows], "cuda", True, lambda r: ticks.append(r["provider"]))
    assert calls == ["a", "b", "c", "b", "a"] and ticks == calls
    assert [(r["provider"], ms) for r, ms in out] == [("a", 2.0), ("b", 1.0)]
    assert rows[2]["note"].startswith("failed: RuntimeError: not capturable")
    times.update(a=[5.0], b=[6.0])
    calls.clear()
    out = runner.time_in_rounds([(r, r["provider"]) for r in rows[:2]], "cpu", False, lambda r: None)
    assert calls == ["a", "b"] and [ms for _, ms in out] == [5.0, 6.0]


def test_quantized_takes_one_factor_a_head():
    """``runner.quantized``: float8 e4m3 with one descale factor per (batch, head), the largest value of each head
    at float8's largest (448), and ``t8 * scale`` within e4m3's step (2^-3 relative, 2^-9 absolute below 2^-6) of
    ``t``; a head of zeros keeps a positive factor."""
    from fmha.bench.runner import quantized
    t = torch.randn(2, 3, 40, 16) * torch.tensor([1.0, 30.0, 1e-3])[None, :, None, None]
    t[1, 2] = 0.0
    t8, scale = quantized(t)
    assert t8.dtype == torch.float8_e4m3fn and scale.shape == (2, 3) and (scale > 0).all()
    back = t8.float() * scale[:, :, None, None]
    peak = t8.float().abs().amax(dim=(2, 3))
    assert torch.allclose(peak[peak > 0], torch.full_like(peak[peak > 0], 448.0))
    assert ((back - t).abs() <= t.abs() / 8 + 2.0 ** -9 * scale[:, :, None, None]).all()
    assert (back[1, 2] == 0).all()
