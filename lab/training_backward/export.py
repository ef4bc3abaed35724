"""Export the bundle of the study's GPU runs, for sm_90a: the kernels of
tests/test_gpu_autograd.py (its test bodies replayed on the CPU through calls.py's recording
reference kernels; each test's own checks run too, against torch on the CPU), of curve.py
(one training step replayed likewise), of tests/test_layout_step.py (its LAYOUT_CASES in
the four layouts), of bench.py (its GEMM list) and of bench_act_grad.py. A part of a test
name replays those tests only: ``--what dbias`` the kernels of the bias-gradient tests
(act_grad.DBIAS, v15's ACT_GRAD_DBIAS), their forward, dgrad and wgrad included;
``bench_wgrad_dbias`` adds that benchmark's kernels (``--cases bounded``: its BOUNDED set
only). ``--ffi-wheel 3.12`` puts TVM's FFI wheel for the GPU host's Python into the bundle
(wheels/).

    python lab/training_backward/export.py --out DIR
                                           [--what tests,layouts,curve,bench,bench_act_grad,act_save]
                                           [--tokens 4096,16384] [--ffi-wheel 3.12]
                                           [--dry-run]
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import itertools
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import calls as C  # noqa: E402


def _test_module():
    spec = importlib.util.spec_from_file_location("test_gpu_autograd",
                                                  ROOT / "tests" / "test_gpu_autograd.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.DEVICE = "cpu"
    mod._sync = lambda: None
    return mod


# not replayed on the CPU: test_matmul_layouts calls tirx_gemm.matmul (matmul_layout_requests);
# test_compiled_training_step calls test_linear_grads' kernels (its M=77 bf16 bias layer);
# test_compiled_op_on_a_transposed_view test_matmul_layouts' (NT and TN, its first case, bf16);
# test_compiled_training_step_fused_act_grad test_activation_grads' (gelu, M=77);
# test_compiled_training_step_fused_dbias test_fused_act_grad_dbias' (gelu, bf16)
NOT_REPLAYED = ("test_matmul_layouts", "test_compiled_training_step",
                "test_compiled_op_on_a_transposed_view",
                "test_compiled_training_step_fused_act_grad",
                "test_compiled_training_step_fused_dbias")


def matmul_layout_requests(mod, sm_count: int, seen: set) -> list:
    """The kernels of ``mod.test_matmul_layouts``: matmul's pick for NN, v15's for NT, TN,
    TT (tirx_gemm.op.layouts), each MATMUL_LAYOUT_CASES shape in both dtypes."""
    from tirx_gemm.op import layouts as L
    reqs = []
    for (M, N, K), dt in itertools.product(mod.MATMUL_LAYOUT_CASES, mod.DTYPES):
        dtype = str(dt).removeprefix("torch.")
        for lay in L.LAYOUTS if K % 8 == 0 else ("TT",):
            rs = (C.requests([("matmul", M, N, K, dt, None, None, None, None)], sm_count)
                  if lay == "NN" else
                  [C.layout_request(M, N, K, dtype, lay[0] == "T", lay[1] == "T", sm_count)])
            reqs += [r for r in rs if C._once(seen, r)]
    return reqs


def replay(mod, only: str | None = None) -> list:
    """Run every test body of ``mod`` on the CPU (or those whose name holds ``only``), each
    parametrization; return the calls."""
    from tirx_gemm.op import autograd as AG
    AG.set_backward_step("v12")
    try:
        with C.recording() as rec:
            for name, fn in inspect.getmembers(mod, inspect.isfunction):
                if not name.startswith("test_") or (only and only not in name) \
                        or name in NOT_REPLAYED:
                    continue
                marks = [m for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"]
                grids = []
                for m in marks:
                    names = [n.strip() for n in m.args[0].split(",")]
                    grids.append([dict(zip(names, v if len(names) > 1 else (v,)))
                                  for v in m.args[1]])
                for combo in itertools.product(*grids):
                    kw = {k: v for d in combo for k, v in d.items()}
                    fn(**kw)
    finally:
        AG.set_backward_step(None)
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sm-count", type=int, default=132)
    ap.add_argument("--dry-run", action="store_true", help="list the kernels, build nothing")
    ap.add_argument("--jobs", type=int, default=1, help="parallel builds (default 1)")
    ap.add_argument("--what", default="tests,layouts,curve,bench",
                    help="tests | TEST_NAME_PART (those GPU tests only, e.g. dbias), "
                         "matmul_layouts, layouts, curve, bench, bench_act_grad, act_save, "
                         "bench_wgrad_dbias")
    ap.add_argument("--tokens", default=None, help="bench.py's token counts (default: all)")
    ap.add_argument("--cases", default="all",
                    help="bench_wgrad_dbias.py's case set (all, bounded)")
    ap.add_argument("--ffi-wheel", default=None, metavar="PY",
                    help="add apache-tvm-ffi's wheel for this Python (e.g. 3.12) to the bundle")
    args = ap.parse_args(argv)
    what = args.what.split(",")
    known = {"tests", "layouts", "curve", "bench", "matmul_layouts", "bench_act_grad",
             "act_save", "bench_wgrad_dbias"}
    rec = replay(_test_module()) if "tests" in what else []
    for part in set(what) - known:
        rec += replay(_test_module(), only=part)
    if "curve" in what:
        import curve
        rec += curve.record_calls()
    reqs = C.requests(rec, args.sm_count)
    seen: set = set()
    reqs = [r for r in reqs if C._once(seen, r)]
    if "tests" in what or "matmul_layouts" in what:
        reqs += matmul_layout_requests(_test_module(), args.sm_count, seen)
    if "layouts" in what:  # tests/test_layout_step.py's GPU cases
        spec = importlib.util.spec_from_file_location("test_layout_step",
                                                      ROOT / "tests" / "test_layout_step.py")
        lay = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(lay)
        for M, N, K, dtype in lay.LAYOUT_CASES:
            for (am, bm), tune in itertools.product(lay.LAYOUTS, lay.TUNES.values()):
                r = C.layout_request(M, N, K, dtype, am == "MN", bm == "MN", args.sm_count,
                                     tune)
                if C._once(seen, r):
                    reqs.append(r)
        from tirx_gemm.op import autograd as AG
        for a_mn in (True, False):  # its RUNTIME_K test: A MN-major (wgrad), K-major (dgrad)
            rk = C.layout_request(512, 768, 64, "bfloat16", a_mn, True, args.sm_count,
                                  {**AG.LAYOUT_TUNE, "RUNTIME_K": True})
            if C._once(seen, rk):
                reqs.append(rk)
    if "bench" in what:
        import bench
        tokens = tuple(int(t) for t in args.tokens.split(",")) if args.tokens else bench.TOKENS
        reqs += [r for r in bench.requests(args.sm_count, tokens) if C._once(seen, r)]
    if "bench_act_grad" in what:
        import bench_act_grad
        tokens = tuple(int(t) for t in args.tokens.split(",")) if args.tokens else \
            bench_act_grad.TOKENS
        reqs += [r for r in bench_act_grad.requests(args.sm_count, tokens) if C._once(seen, r)]
    if "act_save" in what:  # v15's ACT_SAVE forwards: the GPU tests' and bench_act_grad's
        import bench_act_grad
        reqs += [r for r in bench_act_grad.save_requests(args.sm_count) if C._once(seen, r)]
    if "bench_wgrad_dbias" in what:
        import bench_wgrad_dbias
        reqs += [r for r in bench_wgrad_dbias.requests(args.sm_count, args.cases)
                 if C._once(seen, r)]
    print(f"{len(rec)} GEMM calls recorded, {len(reqs)} kernels")
    for st, shape, kw in reqs:
        print(f"  {st.key} {shape} {kw}")
    if args.dry_run:
        return 0
    from tirx_gemm.compile import bundle
    n = bundle.export(reqs, Path(args.out), jobs=args.jobs, progress=True,
                      ffi_wheel_python=args.ffi_wheel)
    print(f"exported {n} kernels to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
