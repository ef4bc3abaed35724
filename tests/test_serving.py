"""The op inside serving stacks, on the CPU: kernel names that say what ran (compile/names.py,
the build pipeline's global symbol) and where workspace operands live under streams and CUDA
graphs (run/workspace.py: per stream eagerly, allocated aside from the calling thread; fresh
per call while capturing). The GPU half is tests/test_serving_gpu.py."""
import re
import threading

import pytest
import torch

from tirx_gemm import registry
from tirx_gemm.compile.names import kernel_name, kernel_symbol
from tirx_gemm.run import workspace as W

V12 = registry.get("v12", "sm_90a")
V9 = registry.get("v9", "sm_90a")


def test_v15_kernel_names_say_the_layout_and_the_backward_epilogue():
    """dgrad (NT), wgrad (TN, TT) and the backward's epilogues are told apart in a profile,
    and explain prints the name of the kernel a transposed call runs."""
    from tirx_gemm.op import autograd as AG
    from tirx_gemm.op import layouts as L
    v15 = registry.get("v15", "sm_90a")
    kw = dict(AG.LAYOUT_TUNE, dtype="bfloat16")
    names = {lay: kernel_name(v15, {**kw, **L.kwargs_for(lay, "bfloat16", 132)})
             for lay in ("NN", "NT", "TN", "TT")}
    assert len(set(names.values())) == 4, names
    assert names["NT"].endswith("_nt") and "_tn" in names["TN"] and "_tt" in names["TT"]
    assert kernel_name(v15, {"ACT_GRAD": "gelu", "BIAS": True}) == "tirx_v15_f16_m128n256_bias_dgelu"
    assert kernel_name(v15, {"ACT_SAVE": "gelu_tanh", "BIAS": True}).endswith("_bias_savegelutanh")
    assert kernel_name(v15, {"B_MAJOR": "MN", "RUNTIME_K": True, "WGRAD_DBIAS": True}) \
        .endswith("_nt_runtimek_dbias")
    text = L.explain(4096, 4096, 4096, "bfloat16", layout="TT")
    _, kw_tt = L.choose(4096, 4096, 4096, "bfloat16", layout="TT")
    assert f"  kernel: {kernel_symbol(v15, kw_tt)}" in text.splitlines()
    assert "_tt" in kernel_symbol(v15, kw_tt)


def test_kernel_name_says_step_dtype_tile_swap_split_and_epilogue():
    kw = {"dtype": "bfloat16", "BLK_M": 128, "BLK_N": 192, "SWAP_AB": True, "SPLIT_K": 2,
          "RUNTIME_M": True, "PDL": True, "SM_COUNT": 132}
    epi = {"BIAS": "bfloat16", "ACT": "silu"}
    assert kernel_name(V12, kw, epilogue=epi) == "tirx_v12_bf16_m128n192_swap_split2_bias_silu"
    assert kernel_symbol(V12, kw, epilogue=epi).endswith("_bias_silu_kernel")
    assert kernel_name(V9, {}) == "tirx_v9_f16_m128n256"  # the step's default tile, fp16
    assert kernel_name("v12", {"BLK_M": 64, "BLK_N": 8}, "torch.bfloat16") \
        == "tirx_v12_bf16_m64n8"
    assert kernel_name(V12, {"STREAM_K": True, "BLK_M": 128, "BLK_N": 128}) \
        == "tirx_v12_f16_m128n128_streamk"
    assert kernel_name(V12, {"ACT": "gelu_tanh", "OUT_DTYPE": "float32", "BLK_M": 64,
                             "BLK_N": 64}) == "tirx_v12_f16_m64n64_gelutanh_f32out"
    assert kernel_name(V12, {"SWIGLU": True, "BLK_M": 64, "BLK_N": 64, "dtype": "bfloat16"}) \
        == "tirx_v12_bf16_m64n64_swiglu"
    assert kernel_name(V12, {"SPLIT_K": 1, "BLK_M": 64, "BLK_N": 64}) == "tirx_v12_f16_m64n64"
    # the bias staged in shared memory (BIAS_SMEM) is another kernel than the register path's
    assert kernel_name(V12, {"BLK_M": 128, "BLK_N": 256, "BIAS_SMEM": True, "dtype": "bfloat16"},
                       epilogue={"BIAS": "bfloat16", "ACT": "gelu"}) \
        == "tirx_v12_bf16_m128n256_smembias_gelu"


def test_every_kernel_matmul_picks_has_a_distinct_c_identifier():
    """Over the picks of a few layers' every token count, a name is a C identifier, and two
    picks whose tile, swap, split or epilogue differ never share it."""
    from tirx_gemm import matmul as mm
    seen = {}
    for N, K in ((1536, 1024), (1024, 2816), (4096, 4096), (14336, 4096)):
        for epi in (None, {"BIAS": "bfloat16", "ACT": "gelu"}):
            for step, kw, _, _ in mm.variants(N, K, "bfloat16", max_m=2048, epilogue=epi):
                name = kernel_name(registry.get(step, "sm_90a"), kw)
                assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
                what = (step, kw.get("BLK_M"), kw.get("BLK_N"), bool(kw.get("SWAP_AB")),
                        kw.get("SPLIT_K") or 1, bool(kw.get("STREAM_K")), kw.get("BIAS"),
                        kw.get("ACT"))
                assert seen.setdefault(name, what) == what, name


def test_a_build_exports_its_kernel_under_its_name():
    """The pipeline's global symbol: the CUDA kernel is kernel_symbol(...), the library's
    entry stays main (TVM's __tvm_ffi_main alias), so loading is unchanged."""
    pytest.importorskip("tvm")
    from tirx_gemm.compile.api import build
    kw = {"dtype": "bfloat16", "SM_COUNT": 132, "RUNTIME_M": True, "BLK_M": 64, "BLK_N": 8,
          "SWAP_AB": True, "SPLIT_K": 2, "L2_GROUP": 8}
    r = build("v12", 128, 1536, 1024, arch="sm_90a", **kw)
    sym = kernel_symbol(V12, kw)
    assert sym == "tirx_v12_bf16_m64n8_swap_split2_kernel"
    assert re.search(rf"__global__ void __launch_bounds__\(\d+\) {sym}\(", r.cuda_source)
    assert "kernel_kernel" not in r.cuda_source
    lib = r.lib_path.read_bytes()
    assert b"__tvm_ffi_main" in lib and sym.encode() in r.lib_path.with_name(
        "kernel.cubin").read_bytes()
    assert r.smem_bytes  # read from the host code's launch of the renamed kernel


# --------------------------------------------------------------------------------------
# workspaces: the policy of run/workspace.py with the CUDA calls replaced by CPU stand-ins
# --------------------------------------------------------------------------------------
class _Stream:
    def __init__(self, ptr):
        self.cuda_stream = ptr


@pytest.fixture
def cpu_cuda(monkeypatch):
    """Streams and zero-fills on the CPU: the current stream is state["stream"], capture is
    state["capturing"]; every zero-fill records the thread that made it."""
    state = {"stream": 7, "capturing": False, "threads": []}
    monkeypatch.setattr(W, "_current_stream", lambda index: _Stream(state["stream"]))
    monkeypatch.setattr(W, "_raw_stream", lambda index: state["stream"])
    monkeypatch.setattr(W, "_capturing", lambda: state["capturing"])

    def zeros_on(specs, index, stream):
        state["threads"].append(threading.get_ident())
        return tuple(torch.zeros(shape, dtype=getattr(torch, dt)) for _, shape, dt in specs)
    monkeypatch.setattr(W, "_zeros_on", zeros_on)
    monkeypatch.setattr(W, "_device", lambda index: torch.device("cpu"))
    monkeypatch.setattr(W, "_torch", torch)
    monkeypatch.setattr(W, "_arenas", {})
    monkeypatch.setattr(W, "_spent_warned", set())
    return state


def _v11():
    kw = {"SM_COUNT": 132, "SPLIT_K": 8, "REDUCE": "spread", "RUNTIME_M": True}
    step = registry.get("v11", "sm_90a")
    return step, kw, W.Workspaces(lambda M, N, K: step.workspace_specs(M, N, K, kw), True)


def test_a_stream_keeps_one_zeroed_set_made_off_the_calling_thread_and_grown(cpu_cuda):
    step, kw, ws = _v11()
    small = ws.persistent(100, 256, 16384, 0)
    want = step.workspace_specs(100, 256, 16384, kw)
    assert [tuple(t.shape) for t in small] == [shape for _, shape, _ in want]
    assert all(int(t.abs().sum()) == 0 for t in small)
    assert cpu_cuda["threads"] and threading.get_ident() not in cpu_cuda["threads"]
    assert ws.persistent(50, 256, 16384, 0) is small  # large enough: kept
    big = ws.persistent(1000, 256, 16384, 0)
    need = step.workspace_specs(1000, 256, 16384, kw)
    assert all(t.shape[i] >= n for t, (_, shape, _) in zip(big, need)
               for i, n in enumerate(shape))
    assert ws.persistent(100, 256, 16384, 0) is big  # never shrinks


def test_two_streams_never_share_a_set(cpu_cuda):
    _, _, ws = _v11()
    first = ws.persistent(100, 256, 16384, 0)
    cpu_cuda["stream"] = 9
    other = ws.persistent(100, 256, 16384, 0)
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(first, other))
    call = W.CallWorkspace(ws, 100, 256, 16384, 0)
    assert call.get() is other
    cpu_cuda["stream"] = 7
    assert call.get() is first and set(call.by_stream) == {7, 9}


def test_while_capturing_every_call_gets_fresh_buffers_counters_zero(cpu_cuda):
    _, _, ws = _v11()
    call = W.CallWorkspace(ws, 100, 256, 16384, 0)
    eager = call.get()
    made = len(cpu_cuda["threads"])
    cpu_cuda["capturing"] = True
    one, two = call.get(), call.get()
    assert one is not two and one is not eager and len(cpu_cuda["threads"]) == made
    cnt = [t for t in one if not t.is_floating_point()]
    assert cnt and all(int(t.abs().sum()) == 0 for t in cnt)
    assert set(call.by_stream) == {7}  # nothing kept from a capture


def test_a_kernel_without_workspace_passes_nothing():
    from tirx_gemm import matmul as mm
    ws = W.Workspaces(lambda M, N, K: V9.workspace_specs(M, N, K, {"RUNTIME_M": True}), True)
    assert not ws.any(100, 256, 64)
    loaded = mm._Loaded.__new__(mm._Loaded)
    loaded.ws = ws
    assert loaded.workspace(100, 256, 64, torch.device("cuda", 0)) == ()


def test_aside_runs_on_another_thread_and_raises_there_errors_here():
    assert W.aside(threading.get_ident) != threading.get_ident()
    with pytest.raises(ZeroDivisionError):
        W.aside(lambda: 1 // 0)


# --------------------------------------------------------------------------------------
# the dispatcher path: one Python kernel, the op's contract checked by opcheck
# --------------------------------------------------------------------------------------
def test_the_op_passes_opcheck_with_a_stand_in_kernel(monkeypatch):
    """Schema, fake tensors and AOT dispatch of torch.ops.tirx_gemm.matmul / swiglu, with
    tirx_gemm.matmul replaced by a CPU stand-in (the registration is what is checked)."""
    from tirx_gemm import torch_op
    monkeypatch.setattr(torch_op, "_matmul", lambda a, b, *rest, step=None, sync=False: a @ b.T)
    monkeypatch.setattr(torch_op, "_swiglu", lambda a, fused, out_dtype=None, sync=False:
                        (a @ fused.T)[:, ::2].contiguous())
    bf = torch.bfloat16
    a, b = torch.randn(16, 64, dtype=bf), torch.randn(32, 64, dtype=bf)
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch_op.OP, (a, b), test_utils=utils)
    torch.library.opcheck(torch_op.SWIGLU_OP, (a, b), test_utils=utils)


_ONE_KERNEL = r"""
import inspect, sys, torch
from tirx_gemm import torch_op
from tirx_gemm.op import autograd as AG
# CPU tensors stand in for CUDA ones: CPU counted as the op's backend, registered again with it
torch_op._BACKEND_KEYS = (torch._C.DispatchKey.CPU,)
torch_op.register_autograd(torch_op.NAME, AG._backward_matmul, setup_context=AG._setup_matmul)
seen = []
def stand_in(a, b, *rest, step=None, sync=False):
    seen.append([(f.function, f.filename) for f in inspect.stack()[1:]])
    return a @ b.T
torch_op._matmul = stand_in
a, b = torch.randn(4, 16), torch.randn(8, 16)
torch.testing.assert_close(torch_op.OP(a, b), a @ b.T)
frames = seen[0]
assert frames[0][0] == "kernel" and frames[0][1].endswith("torch_op.py"), frames[:3]
# then OpOverload.__call__ and this script: one frame of torch_op, no other Python kernel
assert frames[1][0] == "__call__" and frames[2][1] == "<string>", frames[:3]
assert not [f for f in frames if "_library" in f[1] or f[0] in ("redispatch", "backend_impl")]
print("one kernel")
"""


def test_the_dispatcher_calls_one_python_kernel():
    """torch.ops.tirx_gemm.matmul reaches the implementation through one Python frame of
    torch_op: no custom_op wrappers, and with the backward registered through
    torch_op.register_autograd (the library's registration) a call that records no gradient skips torch's
    generated autograd kernel and its redispatch. In its own process: the registration it
    makes stays out of the other tests' op."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _ONE_KERNEL], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and "one kernel" in out.stdout, out.stdout + out.stderr


# --------------------------------------------------------------------------------------
# a kernel built for one card is refused on another
# --------------------------------------------------------------------------------------
def test_a_bundle_for_another_cards_sm_count_is_refused_with_the_export_to_run(tmp_path):
    """A bundle exported for 132 SMs asked for the kernel a 114-SM H100 PCIe needs: one line
    naming the kernel, the bundle, and the export command with --num-sms 114."""
    from tirx_gemm import matmul as mm
    from tirx_gemm.compile.bundle import export
    pytest.importorskip("tvm")
    step_id, kw = mm.choose(1, 1024, 2816, "bfloat16", "sm_90a", 132)
    st = registry.get(step_id, "sm_90a")
    bundle = tmp_path / "b"
    export([(st, mm.build_shape((1, 1024, 2816), kw), kw)], bundle, progress=False)
    lib, _ = mm.kernel_source(st, (1, 1024, 2816), kw, bundle)  # its own card: served
    assert lib.is_file()
    other = mm.choose(1, 1024, 2816, "bfloat16", "sm_90a", 114)[1]
    with pytest.raises(ValueError) as info:
        mm.kernel_source(st, (1, 1024, 2816), other, bundle)
    msg = str(info.value)
    assert "\n" not in msg and "SM_COUNT=114" in msg and "--num-sms 114" in msg, msg


def test_a_first_load_inside_a_capture_is_refused_with_what_to_do(monkeypatch):
    from tirx_gemm import matmul as mm
    monkeypatch.setattr(W, "_capturing", lambda: True)
    monkeypatch.setattr(mm, "kernel_source", lambda *a: pytest.fail("no load while capturing"))
    step_id, kw = mm.choose(1, 1024, 2816, "bfloat16", "sm_90a", 132)
    with pytest.raises(RuntimeError) as info:
        mm._load(registry.get(step_id, "sm_90a"), (1, 1024, 2816), kw)
    msg = str(info.value)
    assert "\n" not in msg and "captures a graph" in msg and "before capturing" in msg


def test_a_remembered_call_keeps_nothing_on_the_host(monkeypatch):
    """The lean path (a remembered call; the kernel replaced by a stand-in) and the dispatcher
    path leave Python's allocated blocks where they were after thousands of calls."""
    import sys
    from tirx_gemm import torch_op
    from tirx_gemm.op import matmul as M
    a, b = torch.randn(1, 64, dtype=torch.bfloat16), torch.randn(32, 64, dtype=torch.bfloat16)
    monkeypatch.setattr(M, "_torch", torch)
    monkeypatch.setitem(M._calls, (a.shape, b.shape, a.dtype, a.get_device(), None),
                        M._Call(lambda *args: None, (), "stand-in", (1, 32)))
    for fn in (lambda: torch_op.matmul(a, b), lambda: torch_op.OP(a, b)):
        for _ in range(500):
            fn()
        before = sys.getallocatedblocks()
        for _ in range(20000):
            fn()
        # a block kept per call would be 20000; the bar is one per 100 calls (a one-off cache
        # entry made while the loop runs is not a leak)
        assert sys.getallocatedblocks() - before < 200


def test_the_generation_profile_counts_gpu_work_its_idle_gaps_and_graph_launches():
    """lab/serving_stacks/generate_bench.py --profile-tokens: a decode step's profile summary
    from (device, start us, duration us, name) events; GPU work on one stream, so the idle
    time is the span minus the busy time, and the host's graph launches are counted."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "lab" / "serving_stacks" / "generate_bench.py"
    spec = importlib.util.spec_from_file_location("generate_bench", path)
    gb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gb)
    GPU, CPU = "cuda", "cpu"
    raw = [(CPU, 0.0, 4.0, "cudaGraphLaunch"), (GPU, 10.0, 5.0, "tirx_v12_bf16_m64n16"),
           (GPU, 18.0, 2.0, "rmsnorm"), (CPU, 20.0, 3.0, "cudaGraphLaunch"),
           (GPU, 30.0, 5.0, "tirx_v12_bf16_m64n16"), (CPU, 31.0, 1.0, "aten::mm")]
    s = gb.summarize_events(raw, GPU, top=1)
    assert (s["kernels"], s["kernel_busy_us"], s["kernel_span_us"], s["gpu_idle_us"]) \
        == (3, 12.0, 25.0, 13.0)
    assert (s["graph_launches"], s["graph_launch_cpu_us"]) == (2, 7.0)
    assert s["top_kernels"] == [{"name": "tirx_v12_bf16_m64n16", "count": 2, "us": 10.0}]
    assert gb.summarize_events([], GPU)["kernels"] == 0


def test_the_decode_linears_study_names_each_paths_kernels_by_the_gaps_between_calls():
    """lab/serving_stacks/decode_linears.py: the kernels of one profiled eager call per path,
    told apart by the idle gap the script leaves after each call; a count of runs that does
    not match the paths names none of them."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "lab" / "serving_stacks" / "decode_linears.py"
    spec = importlib.util.spec_from_file_location("decode_linears", path)
    dl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dl)
    ev = [(0.0, 4.0, "nvjet_bias"), (2000.0, 3.0, "tirx_v12_bf16_m64n16_swap_kernel"),
          (2004.0, 1.0, "elementwise_add"), (4100.0, 5.0, "tirx_v12_bf16_m64n16_bias_kernel")]
    got = dl.group_by_gaps(ev, ["F.linear", "tirx+add", "tirx"], 1000.0)
    assert got == {"F.linear": ["nvjet_bias"],
                   "tirx+add": ["tirx_v12_bf16_m64n16_swap_kernel", "elementwise_add"],
                   "tirx": ["tirx_v12_bf16_m64n16_bias_kernel"]}
    assert dl.group_by_gaps(ev, ["F.linear", "tirx"], 1000.0) == {"F.linear": ["?"], "tirx": ["?"]}


def test_the_decode_bias_suite_exports_both_sides_of_the_bias_tile_comparison():
    """lab/serving_stacks/suites/decode_bias_tiles.json: for each decode bias layer the
    bundle holds matmul's pick (the swap-AB kernel with the bias, what decode_linears.py times
    as "tirx") and v12's non-swap bias tile (``"epilogue_steps": ["v12"]``, its --bias-tile
    path), both built with N and K at run time."""
    from pathlib import Path
    from tirx_gemm import matmul as mm
    from tirx_gemm.op.suite import export_requests, load_suite
    path = Path(__file__).resolve().parents[1] / "lab/serving_stacks/suites/decode_bias_tiles.json"
    got = {tuple(sorted(kw.items())) for _, _, kw in export_requests(path, "matmul", "sm_90a", 132)}
    for e in load_suite(path).entries:
        for step in (None, "v12"):
            if step is None:
                kw = mm.choose(e.M, e.N, e.K, "bfloat16", "sm_90a", 132, {"BIAS": "bfloat16"})[1]
            else:
                kw = mm.choose_epilogue_on(step, e.M, e.N, e.K, "bfloat16", "sm_90a", 132,
                                           {"BIAS": "bfloat16"})[1]
            assert kw.get("SWAP_AB", False) == (step is None) and kw["RUNTIME_NK"], (e, kw)
            assert tuple(sorted(kw.items())) in got, (e.M, e.N, step)


def test_captured_launches_take_their_own_zero_counters_from_the_arena(cpu_cuda):
    """The first eager call makes the device's capture arena (zeroed, off the calling thread);
    each captured launch's counters are then a slice of it that no other launch gets, aligned,
    zero, with no fill of their own; the scratch is fresh per launch."""
    step, kw, ws = _v11()
    call = W.CallWorkspace(ws, 100, 256, 16384, 0)
    call.get()
    arena = W._arenas[0]
    assert arena.tensor.numel() == W.ARENA_COUNTERS and W.arena_used(0) == 0
    made = len(cpu_cuda["threads"])
    cpu_cuda["capturing"] = True
    one, two = call.get(), call.get()
    assert len(cpu_cuda["threads"]) == made  # nothing made or filled while capturing
    (n_cnt,) = [_numel for _, shape, dt in step.workspace_specs(100, 256, 16384, kw)
                if dt == "int32" for _numel in [W._numel(shape)]]
    base = arena.tensor.data_ptr()
    offs = []
    for got in (one, two):
        (cnt,) = [t for t in got if not t.is_floating_point()]
        assert cnt.numel() == n_cnt and int(cnt.abs().sum()) == 0
        offs.append((cnt.data_ptr() - base) // 4)
    assert offs[0] % W.ARENA_ALIGN == 0 and offs[1] % W.ARENA_ALIGN == 0
    assert offs[1] >= offs[0] + n_cnt  # disjoint
    assert W.arena_used(0) == 2 * (-(-n_cnt // W.ARENA_ALIGN) * W.ARENA_ALIGN)
    assert one[0].data_ptr() != two[0].data_ptr()  # the scratch: fresh per launch


def test_a_spent_arena_falls_back_to_a_zeroed_tensor_and_warns_once(cpu_cuda, monkeypatch):
    step, kw, ws = _v11()
    (n_cnt,) = [W._numel(shape) for _, shape, dt in step.workspace_specs(100, 256, 16384, kw)
                if dt == "int32"]
    monkeypatch.setattr(W, "ARENA_COUNTERS", -(-n_cnt // W.ARENA_ALIGN) * W.ARENA_ALIGN)
    call = W.CallWorkspace(ws, 100, 256, 16384, 0)
    call.get()
    cpu_cuda["capturing"] = True
    first = call.get()  # the arena's only slice
    with pytest.warns(RuntimeWarning, match="counters set aside for captured launches"):
        second = call.get()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        third = call.get()  # warned once only
    base = W._arenas[0].tensor
    for got, inside in ((first, True), (second, False), (third, False)):
        (cnt,) = [t for t in got if not t.is_floating_point()]
        assert int(cnt.abs().sum()) == 0
        assert (base.data_ptr() <= cnt.data_ptr() < base.data_ptr() + 4 * base.numel()) == inside



def test_the_capture_arena_verdict_is_the_records_and_the_readme_quotes_it():
    """lab/serving_stacks/arena_verdict.py over the arena A/B's records passes (the arena
    stays), and the README quotes its geomean and worst gain and its range as computed."""
    import json
    import sys
    from pathlib import Path
    ROOT = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(ROOT / "lab" / "serving_stacks"))
    import arena_verdict as v
    recs = [json.loads(x) for x in (ROOT / "lab/serving_stacks/records/capture_arena_h100.jsonl")
            .read_text().splitlines()]
    gains = [g for _, g in v.gains(recs)]
    assert len(gains) == 24 and v.passes(recs)
    text = (ROOT / "lab/serving_stacks/README.md").read_text()
    quoted = (f"over the arena's was {min(gains):.2f}-{max(gains):.2f}, geomean "
              f"{v.geomean(gains):.2f}")
    assert quoted in " ".join(text.split()), quoted
