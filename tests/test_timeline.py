"""In-kernel timelines on the CPU (tirx_gemm.timeline, the hooks and the format; its report
side, tirx_gemm.report.timeline_view and .timeline_files): the buffer format, decoding,
pairing (begin/end and wait_group drains), the window kept in the repository, the Chrome
trace JSON, the Gantt PNG, the summary, the CLI parser, and (with TVM) that the event hooks
in the verbs change nothing in a normal build (the steps' PrimFuncs equal those built with
the hooks cut out of helpers.py / hopper/), that no step file carries a timeline line,
and that an instrumented build of a real step gains exactly one operand, its events, and
is refused for sm_100a (no clock) and for steps that never start the recording."""

import argparse
import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tirx_gemm import timeline as TL
from tirx_gemm.report import timeline_files as TF
from tirx_gemm.report import timeline_view as TV


# --------------------------------------------------------------------------------------
# a synthetic buffer, written the way tirx_gemm_tl_mark writes one
# --------------------------------------------------------------------------------------
def _buffer(lanes: dict, grid: int, roles: int = len(TL.ROLES), cap: int = 8):
    """lanes: {(cta, role): [(t_ns, kind, edge, arg, sm), ...]} -> int64 words."""
    w = np.zeros(TL.HEADER_WORDS + grid * roles * cap * TL.RECORD_WORDS, dtype=np.int64)
    w[:TL.HEADER_WORDS] = [TL.MAGIC, TL.FORMAT, grid, roles, cap, TL.HEADER_WORDS, 0, 0]
    for (cta, role), recs in lanes.items():
        base = TL.HEADER_WORDS + (cta * roles + role) * cap * TL.RECORD_WORDS
        for i, (t, kind, edge, arg, sm) in enumerate(recs[:cap]):
            meta = (arg << 32) | (sm << 16) | (edge << 8) | kind
            w[base + 2 * i] = t
            w[base + 2 * i + 1] = np.int64(meta)
    return w


T0 = 1_700_000_000_000  # a globaltimer value, ns
B, E, P = TL.BEGIN, TL.END, TL.POINT


def _sample():
    c0 = TL.CONSUMER0
    return _buffer({
        (0, TL.PRODUCER): [(T0 + 0, TL.TMA_ISSUE, P, 0, 7), (T0 + 10, TL.TMA_ISSUE, P, 1, 7)],
        (0, c0): [(T0 + 5, TL.FULL_WAIT, B, 0, 7), (T0 + 900, TL.FULL_WAIT, E, 0, 7),
                  (T0 + 910, TL.WGMMA, B, 0, 7), (T0 + 920, TL.WGMMA, B, 1, 7),
                  (T0 + 1500, TL.WGMMA, E, 0, 7), (T0 + 2100, TL.WGMMA, E, 1, 7),
                  (T0 + 2200, TL.EPILOGUE, B, 3, 7), (T0 + 3200, TL.EPILOGUE, E, 3, 7)],
        (1, c0): [(T0 + 50, TL.FULL_WAIT, B, 1, 9), (T0 + 60, TL.FULL_WAIT, E, 1, 9),
                  (T0 + 70, TL.SCHED, P, -1, 9)],
    }, grid=2)


def test_layout_sizes_the_buffer_for_every_grid():
    lay = TL.layout(4096, 4096, 4096)                  # v4/v5: a CTA per 128x128 tile
    assert (lay.ctas, lay.roles) == (1024, len(TL.ROLES))
    assert lay.cap == TL.EV_SLICE * 64 + TL.EV_TILE
    per = TL.layout(4096, 4096, 4096, {"SM_COUNT": 132}, persistent=True)
    assert per.ctas == 264                             # v6 may put two CTAs on an SM
    assert per.cap == 8 * (TL.EV_SLICE * 64 + TL.EV_TILE)  # ceil(1024 / 132) tiles
    (name, shape, dtype), = TL.buffer_specs(200, 136, 200)
    assert (name, dtype) == (TL.OPERAND, "int64")
    assert shape == (TL.layout(200, 136, 200).words,)
    assert TL.plain_kwargs({"TIMELINE": True, "SM_COUNT": 4}) == {"SM_COUNT": 4}
    assert TL.is_instrumented({"TIMELINE": True}) and not TL.is_instrumented({})


def test_decode_reads_records_lanes_and_truncation():
    tl = TV.decode(_sample())
    assert (tl.grid, tl.roles, tl.cap, tl.t0_ns, tl.lane_ctas) == (2, 3, 8, T0, 2)
    assert len(tl.records) == 13
    assert tl.truncated == [(0, TL.CONSUMER0)]         # 8 of 8 records used
    sched = [r for r in tl.records if r.kind == TL.SCHED][0]
    assert (sched.cta, sched.arg, sched.sm, sched.edge) == (1, -1, 9, TL.POINT)
    import torch  # the run side hands a torch tensor
    assert len(TV.decode(torch.from_numpy(_sample())).records) == 13


def test_decode_refuses_what_is_not_a_timeline():
    with pytest.raises(TV.TimelineError, match="not a timeline"):
        TV.decode(np.zeros(64, dtype=np.int64))
    bad = _sample()
    bad[1] = 99
    with pytest.raises(TV.TimelineError, match="format 99"):
        TV.decode(bad)


def test_spans_pair_begin_and_end_by_arg():
    sp, unmatched = TV.spans(TV.decode(_sample()))
    assert unmatched == []
    wg = [s for s in sp if s.kind == TL.WGMMA]
    assert [(s.arg, s.start_ns, s.dur_ns) for s in wg] == [(0, 910, 590), (1, 920, 1180)]
    ep = [s for s in sp if s.kind == TL.EPILOGUE][0]
    assert (ep.arg, ep.start_ns, ep.dur_ns, ep.point) == (3, 2200, 1000, False)
    assert sum(s.point for s in sp) == 3
    lone = _buffer({(0, 1): [(T0, TL.WGMMA, E, 0, 0), (T0 + 5, TL.STORE, B, 2, 0)]}, grid=1)
    sp, unmatched = TV.spans(TV.decode(lone))
    assert sp == [] and [(r.kind, r.edge) for r in unmatched] == [(TL.WGMMA, E), (TL.STORE, B)]


def test_chrome_trace_is_valid_trace_event_json(tmp_path):
    path = TV.write_chrome_trace(TV.decode(_sample()), tmp_path / "t.json",
                                 {"step": "v5", "device": "test"})
    data = json.loads(path.read_text())                  # plain JSON, loadable as is
    assert TV.load_chrome_trace(path) == data
    events = data["traceEvents"]
    assert data["otherData"]["step"] == "v5"
    assert data["otherData"]["truncated_lanes"] == [[0, TL.CONSUMER0]]
    lanes = {}
    for e in events:
        assert {"name", "ph", "pid", "tid"} <= set(e)
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index",
                                 "thread_sort_index") and "args" in e
            continue
        assert e["ph"] in ("X", "i")
        assert isinstance(e["ts"], float) and e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] >= 0
        else:
            assert e["s"] == "t"
        lanes.setdefault((e["pid"], e["tid"]), []).append(e["ts"])
    for ts in lanes.values():
        assert ts == sorted(ts)                           # monotone per lane
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names[(0, TL.CONSUMER0)] == "consumer 0"
    procs = [e["args"]["name"] for e in events if e["name"] == "process_name"]
    assert procs == ["CTA 0 (SM 7)", "CTA 1 (SM 9)"]
    wg = [e for e in events if e.get("cat") == "wgmma"]
    assert [(e["ts"], e["dur"]) for e in wg] == [(0.91, 0.59), (0.92, 1.18)]   # microseconds
    assert wg[0]["name"] == "wgmma (first slice)" and wg[1]["name"] == "wgmma"
    epi = [e for e in events if e.get("cat") == "epilogue"]
    assert epi[0]["name"] == "epilogue tile (0, 192)"   # tile_of(3): row 0, column 192


def test_gantt_png_is_written(tmp_path):
    trace = TV.chrome_trace(TV.decode(_sample()), {"step": "v5"})
    png = TF.gantt_png(trace, tmp_path / "sub" / "g.png", ctas=2, window=(0, 4), title="test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 2000


def test_notebook_draws_a_recorded_trace_or_says_why_not(tmp_path, capsys):
    import matplotlib
    matplotlib.use("Agg")
    assert TF.draw_recorded("v5", arch="sm_100a") is None
    assert "no clock" in capsys.readouterr().out
    assert TF.draw_recorded("v5", 256, 256, 128, folder=tmp_path) is None
    assert "tirx-gemm trace v5 --arch sm_90a --mnk 256,256,128" in capsys.readouterr().out
    TV.write_chrome_trace(TV.decode(_sample()), TF.recorded_path("v5", 256, 256, 128,
                                                                 folder=tmp_path))
    ax = TF.draw_recorded("v5", 256, 256, 128, folder=tmp_path, ctas=2)
    assert ax is not None and len(ax.get_yticklabels()) == 3   # CTA 0: 2 roles, CTA 1: 1


def test_summary_names_kinds_and_truncation():
    text = TV.summary(TV.decode(_sample()))
    assert "13 records from 2 of 2 CTAs on 2 SMs" in text
    assert "1 lane(s) full" in text and "wgmma" in text and "epilogue" in text


def test_trace_parser_and_sm100a_refusal():
    pytest.importorskip("torch")
    from tirx_gemm.cli import trace as cli_trace
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd")
    cli_trace.register(sub)
    args = p.parse_args(["trace", "v5", "--mnk", "256,256,128", "--out", "x"])
    assert args.fn is cli_trace.cmd_trace and tuple(args.mnk) == (256, 256, 128)
    assert args.arch == "sm_90a" and args.bundle is None and args.ctas == 4
    args = p.parse_args(["trace", "v5", "--arch", "sm_100a"])
    with pytest.raises(ValueError, match="NumSim"):
        cli_trace.trace_main(args)


def test_timeline_imports_no_other_tirx_gemm_module():
    """The verbs and the registry import timeline; it must not import them back."""
    import ast
    from pathlib import Path
    tree = ast.parse(Path(TL.__file__).read_text())
    mods = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    mods += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in mods if m and m.startswith("tirx_gemm")]


def test_recording_calls_are_nothing_outside_an_instrumented_build():
    assert not TL.instrumented()
    for call in (lambda: TL.setup(), lambda: TL.point(TL.TMA_ISSUE, 0, TL.PRODUCER),
                 lambda: TL.begin(TL.WGMMA, 1), lambda: TL.end(TL.WGMMA, 1),
                 lambda: TL.drain(TL.STORE, 0)):
        assert call() is None
    marker = object()
    assert TL.around(marker, TL.FULL_WAIT, 0) is marker   # a plain verb's call, untouched


def test_drains_close_the_oldest_spans_and_unnamed_begins_take_the_end_arg():
    c0, D, U = TL.CONSUMER0, TL.DRAIN, TL.UNNAMED
    buf = _buffer({(0, c0): [
        (T0 + 0, TL.WGMMA, B, 0, 1), (T0 + 10, TL.WGMMA, B, 1, 1),
        (T0 + 20, TL.WGMMA, D, 1, 1),      # wait_group 1: the oldest closes, one stays open
        (T0 + 30, TL.WGMMA, B, 1, 1), (T0 + 40, TL.WGMMA, D, 0, 1),   # wait_group 0: all
        (T0 + 50, TL.EPILOGUE, B, U, 1), (T0 + 90, TL.EPILOGUE, E, TL.tile_code(128, 256), 1),
        (T0 + 95, TL.STORE, D, 0, 1)]}, grid=1, cap=16)  # a drain with nothing open
    sp, unmatched = TV.spans(TV.decode(buf))
    assert unmatched == []
    assert [(s.start_ns, s.dur_ns) for s in sp if s.kind == TL.WGMMA] == \
        [(0, 20), (10, 30), (30, 10)]
    epi, = [s for s in sp if s.kind == TL.EPILOGUE]
    assert TL.tile_of(epi.arg) == (128, 256) and epi.dur_ns == 40


def _long_run(ctas=8, tiles=3, slices=40, period=500):
    """A synthetic persistent run: per CTA, a producer and two consumer lanes, tiles of
    `slices` K steps of `period` ns, an epilogue per tile; roughly the H200's records."""
    lanes = {}
    for cta in range(ctas):
        t = T0 + 100 * cta
        prod, cons = [], {1: [], 2: []}
        for tile in range(tiles):
            for role in (1, 2):
                cons[role].append((t, TL.SCHED, P, tile * ctas + cta, cta))
            for k in range(slices):
                s = k % 4
                prod += [(t + 1, TL.EMPTY_WAIT, B, s, cta), (t + 30, TL.EMPTY_WAIT, E, s, cta),
                         (t + 40, TL.TMA_ISSUE, P, k, cta)]
                for role in (1, 2):
                    cons[role] += [(t + 2, TL.FULL_WAIT, B, s, cta),
                                   (t + 60, TL.FULL_WAIT, E, s, cta),
                                   (t + 64, TL.WGMMA, B, int(k > 0), cta),
                                   (t + 96, TL.WGMMA, TL.DRAIN, 1, cta),
                                   (t + 128, TL.RELEASE, P, s, cta)]
                t += period
            for role in (1, 2):
                cons[role] += [(t + 5, TL.WGMMA, TL.DRAIN, 0, cta),
                               (t + 10, TL.EPILOGUE, B, TL.UNNAMED, cta),
                               (t + 700, TL.EPILOGUE, E, TL.tile_code(128 * tile, 0), cta),
                               (t + 701, TL.STORE, B, 0, cta)]
            t += 800
        lanes[(cta, 0)] = prod
        lanes[(cta, 1)], lanes[(cta, 2)] = cons[1], cons[2]
    cap = max(len(v) for v in lanes.values())
    return _buffer(lanes, grid=ctas, cap=cap)


def test_outputs_keep_a_small_window_and_summarise_the_whole_run(tmp_path):
    tl = TV.decode(_long_run())
    keep = TV.focus(tl)
    assert keep.ctas == (0, 1, 2, 3)                       # the first two clusters
    first_epi = 40 * 500 + 10                              # CTA 0's first tile boundary
    assert keep.center_ns == first_epi and keep.lo_ns < first_epi < keep.hi_ns
    assert keep.hi_ns - keep.lo_ns == 2 * 16 * 500         # 16 K steps on either side
    meta = {"step": "v9", "arch": "sm_90a", "M": 4096, "N": 4096, "K": 4096,
            "dtype": "float16", "device": "NVIDIA H200", "sm_count": 132}
    js, png, txt = TF.write_outputs(tl, tmp_path, "v9_sm_90a_4096x4096x4096", meta,
                                    timing={"timeline_ms": 0.25, "plain_ms": 0.2,
                                            "iters": 40})
    data = json.loads(js.read_text())
    assert js.stat().st_size < TV.MAX_TRACE_BYTES
    assert {e["pid"] for e in data["traceEvents"]} == {0, 1, 2, 3}
    lo, hi = data["otherData"]["window_us"]
    for e in data["traceEvents"]:
        if e["ph"] in ("X", "i"):
            assert e["ts"] <= hi and e["ts"] + e.get("dur", 0) >= lo
    assert png.read_bytes()[:4] == b"\x89PNG"
    text = txt.read_text()
    assert "NVIDIA H200" in text and "1.25x the plain kernel's time" in text
    assert "8 of 8 CTAs" in text and "window kept" in text
    assert "wgmma" in text and "epilogue" in text and "full_wait" in text
    # a window too large for the limit is narrowed around its center
    small = TV.write_chrome_trace(tl, tmp_path / "s.json", keep=keep, max_bytes=20_000)
    lo2, hi2 = json.loads(small.read_text())["otherData"]["window_us"]
    assert small.stat().st_size <= 20_000 and lo2 > lo and hi2 < hi


def test_recorded_figure_uses_the_png_and_summary_beside_the_trace(tmp_path):
    png, text = TF.recorded_figure("v5", "sm_100a")
    assert png is None and "no clock" in text
    png, text = TF.recorded_figure("v5", "sm_90a", (256, 256, 128), folder=tmp_path)
    assert png is None and "tirx-gemm trace v5" in text
    tl = TV.decode(_long_run(ctas=2, tiles=1, slices=8))
    TF.write_outputs(tl, tmp_path, TF.trace_name("v5", "sm_90a", 256, 256, 128),
                     {"M": 256, "N": 256, "K": 128, "device": "NVIDIA H200"})
    png, text = TF.recorded_figure("v5", "sm_90a", (256, 256, 128), folder=tmp_path)
    assert png[:4] == b"\x89PNG" and "NVIDIA H200" in text and "ui.perfetto.dev" in text
    assert "The whole run" in text and "records from 2 of 2 CTAs" in text


# --------------------------------------------------------------------------------------
# with TVM: the hooks change nothing in a normal build; an instrumented one gains one operand
# --------------------------------------------------------------------------------------
def test_no_step_file_carries_a_timeline_line():
    """The events live in the verbs: the lesson diffs between steps stay pure."""
    from pathlib import Path
    from tirx_gemm import registry
    for arch in registry.ARCHES:
        for s in registry.all_steps(arch):
            text = Path(s.source_file).read_text()
            # code, not prose: a card may point at a recorded timeline
            assert not re.search(r"^\s*(from|import)\b.*\btimeline\b", text, re.M), s.key
            assert not re.search(r"\bTL\.", text), s.key


def _cut_hooks(source: str) -> str:
    """A verbs module without its timeline hooks: the ``TL`` import and every ``TL.*(...)``
    statement removed, ``TL.around(call, ...)`` replaced by ``call``, ``TL.setup()``
    wrappers calling straight through (the source as it was before the hooks)."""
    import ast

    class Cut(ast.NodeTransformer):
        def visit_ImportFrom(self, node):
            if any(a.asname == "TL" for a in node.names):
                return None
            return node

        def visit_Expr(self, node):
            call = node.value
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                    and isinstance(call.func.value, ast.Name) and call.func.value.id == "TL":
                return ast.Pass()
            return self.generic_visit(node)

        def visit_Call(self, node):
            self.generic_visit(node)
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
                    and f.value.id == "TL" and f.attr == "around":
                return node.args[0]
            return node

    tree = ast.fix_missing_locations(Cut().visit(ast.parse(source)))
    left = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "TL"]
    assert not left, f"hooks the cut does not know, lines {left}"
    return ast.unparse(tree)


@pytest.fixture(scope="module")
def hookless(tmp_path_factory):
    """A package ``tl_hookless`` with helpers.py / hopper/ / blackwell/ cut of hooks."""
    pytest.importorskip("tvm")
    import importlib
    from pathlib import Path
    import tirx_gemm
    root = tmp_path_factory.mktemp("hookless")
    pkg = root / "tl_hookless"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    src = Path(tirx_gemm.__file__).parent
    (pkg / "helpers.py").write_text(_cut_hooks((src / "helpers.py").read_text()))
    for package in ("hopper", "blackwell"):  # packages: one module per job
        (pkg / package).mkdir()
        for path in sorted((src / package).glob("*.py")):
            (pkg / package / path.name).write_text(_cut_hooks(path.read_text()))
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module("tl_hookless")
    finally:
        sys.path.remove(str(root))
        for m in [m for m in sys.modules if m.startswith("tl_hookless")]:
            sys.modules.pop(m)


def _hookless_builder(step, tmp_path):
    import importlib.util
    from pathlib import Path
    src = Path(step.source_file).read_text()
    for mod in ("helpers", "hopper", "blackwell"):
        src = src.replace(f"from tirx_gemm import {mod} as", f"from tl_hookless import {mod} as")
    path = tmp_path / f"hookless_{step.id}_{step.arch}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules.pop(path.stem, None)
    return getattr(mod, f"hgemm_{step.id}")


_IDENTITY = (("v4", "sm_90a"), ("v7", "sm_90a"), ("v9", "sm_90a"), ("v10", "sm_90a"),
             ("v11", "sm_90a"), ("v7", "sm_100a"))


@pytest.mark.parametrize("step_id,arch", _IDENTITY, ids=[f"{s}@{a}" for s, a in _IDENTITY])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_normal_build_equals_the_build_without_hooks(step_id, arch, dtype, hookless, tmp_path):
    """Option off, a step's PrimFunc (hence its CUDA) is exactly the one built with the
    hooks cut out of the verbs."""
    from tirx_gemm import registry
    step = registry.get(step_id, arch)
    kw = {**step.with_sm_count(132), **({} if dtype == "float16" else {"dtype": dtype})}
    normal = step.builder()(*step.canonical, **kw)
    without = _hookless_builder(step, tmp_path)(*step.canonical, **kw)
    assert normal.script() == without.script()


def test_instrumented_steps_gain_one_operand_and_their_events():
    pytest.importorskip("tvm")
    from tirx_gemm import registry
    for step_id, kinds in (("v5", {TL.CTA, TL.TMA_ISSUE, TL.FULL_WAIT, TL.WGMMA, TL.EPILOGUE,
                                   TL.STORE}),
                           ("v9", {TL.CTA, TL.TMA_ISSUE, TL.FULL_WAIT, TL.EMPTY_WAIT,
                                   TL.WGMMA, TL.RELEASE, TL.EPILOGUE, TL.STORE, TL.SCHED})):
        step = registry.get(step_id, "sm_90a")
        M, N, K = 512, 512, 256
        plain = step.build_primfunc(M, N, K, **step.with_sm_count(8))
        f = step.build_primfunc(M, N, K, **step.with_sm_count(8), TIMELINE=True)
        assert [p.name for p in f.params] == [p.name for p in plain.params] + [TL.OPERAND]
        lay = TL.layout(M, N, K, step.with_sm_count(8),
                        persistent=step.sm_count_kwarg is not None)
        assert tuple(int(x) for x in f.params[-1].shape) == (lay.words,)
        text = f.script()
        assert text.count('T.cuda.func_call("tirx_gemm_tl_setup"') == 1
        calls = text.split('func_call("tirx_gemm_tl_mark", ')[1:]
        # (buffer, cursor, lane, roles, cap, ctas, header, kind, edge, arg, ...)
        seen = {int(c.split(", ")[7]) for c in calls}
        assert {c.split(", ")[0] for c in calls} == {"timeline.data"}
        assert seen == kinds, (step_id, seen ^ kinds)
        assert not TL.instrumented()
    # the normal build after an instrumented one is still the normal build
    assert registry.get("v5", "sm_90a").build_primfunc(M, N, K).script() == \
        registry.get("v5", "sm_90a").build_primfunc(M, N, K).script()


def test_instrumented_build_refuses_sm100a_and_steps_without_a_recording():
    pytest.importorskip("tvm")
    from tirx_gemm import registry
    with pytest.raises(ValueError, match="no clock"):
        registry.get("v5", "sm_100a").build_primfunc(256, 256, 128, TIMELINE=True)
    with pytest.raises(ValueError, match="never calls"):
        registry.get("v2", "sm_90a").build_primfunc(128, 128, 128, TIMELINE=True)
    assert not TL.instrumented()


def test_instrumented_build_lowers_to_cuda_with_the_operand_last():
    """Lowered in a fresh process (no libcuda: TVM keeps the CUDA source, no nvcc)."""
    pytest.importorskip("tvm")
    script = textwrap.dedent('''
        import tvm
        from tirx_gemm import registry
        f = registry.get("v9", "sm_90a").build_primfunc(512, 512, 256, SM_COUNT=8,
                                                        TIMELINE=True)
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        with target:
            exe = tvm.compile(tvm.IRModule({"main": f}), target=target, tir_pipeline="tirx")
        print(exe.mod.imports[0].inspect_source())
    ''')
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    cuda = p.stdout
    sig = next(line for line in cuda.splitlines() if "__global__" in line and "{" in line)
    assert sig.rstrip(" {").endswith("int64_t* __restrict__ timeline_ptr)")
    assert "%%globaltimer" in cuda and cuda.count("void tirx_gemm_tl_mark(") == 1
