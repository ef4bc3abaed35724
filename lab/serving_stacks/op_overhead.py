#!/usr/bin/env python
"""Per-call host cost of tirx_gemm's call paths against F.linear, in one process, interleaved.

For each shape (default 1x1024x1024 and 1x1024x2816, bf16: a decode GEMM, the second a split-K
kernel with workspace operands) it runs round-robin bursts of --calls back-to-back calls of each
path, --reps bursts each (median of >= 1000 calls per path), and reports per call: the host
wall time to enqueue, the host CPU time (time.thread_time) to enqueue, and the end-to-end wall
time (enqueue to GPU done). Paths:

  F.linear            torch.nn.functional.linear(a, b): the target
  direct              tirx_gemm.torch_op.matmul(a, b) eagerly (what tirx_gemm.nn.Linear calls)
  dispatcher          torch.ops.tirx_gemm.matmul(a, b): the op through torch's dispatcher, its
                      backward registered with torch_op.register_autograd
  register_autograd   the same op definition with its backward registered by
                      torch.library.register_autograd (torch's Python autograd kernel in front
                      of every call: the registration the op had before; defined here)
  custom_op           the same implementation registered with torch.library.custom_op (defined
                      here, for comparison)
  F.linear inference_mode    F.linear and the dispatcher path with each burst inside
  dispatcher inference_mode  torch.inference_mode() (autograd's dispatch keys excluded: a serving loop)
  bare launch         the loaded kernel with prepared arguments, no checks, no allocation
  new_empty           the output's allocation alone

and, with --decompose, what the dispatcher path's extra over `direct` is made of (ops defined here,
each with the op's schema and a Python kernel at the Autograd key, as torch_op registers it):

  dispatcher .default._op   the op's C++ callable, without the OpOverloadPacket Python wrapper
  boxed no-op               a Python kernel (with the key set) that returns `a`: the boxed call alone
  boxed no-op no keyset     the same without the key set argument
  boxed no-op 2 args        the same with a (Tensor a, Tensor b) schema: what the optional arguments cost
  boxed new tensor          the no-op returning a.new_empty((M, N)): a fresh tensor back through the box

and the host memory a path keeps: Python's allocated blocks after 2000 more calls, minus before.

  TIRX_GEMM_BUNDLE=DIR python lab/serving_stacks/op_overhead.py [--shapes 1x1024x1024,...]
      [--calls 100] [--reps 15] [--out FILE.jsonl]
"""
import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="1x1024x1024,1x1024x2816")
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--out", default=None)
    p.add_argument("--decompose", action="store_true",
                   help="also the boxed-call paths that split the dispatcher's extra cost")
    args = p.parse_args()

    import torch
    import torch.nn.functional as F
    import tirx_gemm.matmul as mm
    from tirx_gemm import torch_op

    @torch.library.custom_op("tirx_serve_bench::matmul", mutates_args=())
    def _custom(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return mm.matmul(a, b)

    @_custom.register_fake
    def _(a, b):
        return a.new_empty((a.shape[0], b.shape[0]))

    custom = torch.ops.tirx_serve_bench.matmul.default
    from tirx_gemm.op import autograd as AG
    lib = torch.library.Library("tirx_serve_bench", "FRAGMENT")
    lib.define(str(torch_op.OP._schema).replace("tirx_gemm::matmul", "matmul_ra"))
    lib.impl("matmul_ra", torch_op._op, "CompositeExplicitAutograd")
    torch.library.register_autograd("tirx_serve_bench::matmul_ra", AG._backward_matmul,
                                    setup_context=AG._setup_matmul, lib=lib)
    with_torch_autograd = torch.ops.tirx_serve_bench.matmul_ra.default
    if "torch_op.register_autograd" not in Path(AG.__file__).read_text():
        torch_op.register_autograd(torch_op.NAME, AG._backward_matmul, setup_context=AG._setup_matmul)
        print("the op's backward registered here with torch_op.register_autograd "
              "(tirx_gemm.op.autograd uses torch.library.register_autograd)", flush=True)
    schema = str(torch_op.OP._schema).split("::matmul", 1)[1]  # "(Tensor a, ...) -> Tensor"
    for name, sch in (("box_ks", schema), ("box_noks", schema), ("box_new", schema),
                      ("box_2", "(Tensor a, Tensor b) -> Tensor")):
        lib.define(name + sch)
    new_shape = [None]  # (M, N) of the shape being timed
    lib.impl("box_ks", lambda ks, a, b, *rest: a, "Autograd", with_keyset=True)
    lib.impl("box_noks", lambda a, b, *rest: a, "Autograd")
    lib.impl("box_new", lambda ks, a, b, *rest: a.new_empty(new_shape[0]), "Autograd",
             with_keyset=True)
    lib.impl("box_2", lambda a, b: a, "Autograd")
    box = torch.ops.tirx_serve_bench
    dev = torch.cuda.get_device_properties(0)
    card = f"{dev.name} ({dev.multi_processor_count} SMs)"
    print(f"{card}, torch {torch.__version__}", flush=True)
    out = open(args.out, "a") if args.out else None
    for shape in args.shapes.split(","):
        M, N, K = (int(x) for x in shape.split("x"))
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        mm.matmul(a, b, sync=True)
        bare = mm.bare_launch(a, b, y)
        paths = {
            "F.linear": lambda: F.linear(a, b),
            "direct": lambda: torch_op.matmul(a, b),
            "dispatcher": lambda: torch_op.OP(a, b),
            "register_autograd": lambda: with_torch_autograd(a, b),
            "custom_op": lambda: custom(a, b),
            "F.linear inference_mode": lambda: F.linear(a, b),
            "dispatcher inference_mode": lambda: torch_op.OP(a, b),
            "bare launch": bare,
            "new_empty": lambda: a.new_empty((M, N)),
        }
        if args.decompose:
            new_shape[0] = (M, N)
            paths.update({
                "dispatcher .default._op": (lambda f=torch_op.OP._op: f(a, b)),
                "boxed no-op": lambda: box.box_ks(a, b),
                "boxed no-op no keyset": lambda: box.box_noks(a, b),
                "boxed no-op 2 args": lambda: box.box_2(a, b),
                "boxed new tensor": lambda: box.box_new(a, b),
            })
        # the two "inference_mode" paths run their bursts inside torch.inference_mode() (autograd's
        # keys excluded: what a serving loop under inference_mode calls)
        contexts = {n: torch.inference_mode for n in paths if n.endswith(" inference_mode")}
        t0 = time.perf_counter()
        for name, fn in paths.items():  # warm every path (its time printed: a stop says where)
            with contexts.get(name, contextlib.nullcontext)():
                for _ in range(50):
                    fn()
            torch.cuda.synchronize()
            print(f"  {M}x{N}x{K} {name}: warmed up at {time.perf_counter() - t0:.2f} s", flush=True)
        times = {k: ([], [], []) for k in paths}
        for _ in range(args.reps):
            for name, fn in paths.items():
                torch.cuda.synchronize()
                with contexts.get(name, contextlib.nullcontext)():
                    c0, w0 = time.thread_time(), time.perf_counter()
                    for _ in range(args.calls):
                        fn()
                    w1, c1 = time.perf_counter(), time.thread_time()
                torch.cuda.synchronize()
                w2 = time.perf_counter()
                n = args.calls
                times[name][0].append((w1 - w0) / n * 1e6)
                times[name][1].append((c1 - c0) / n * 1e6)
                times[name][2].append((w2 - w0) / n * 1e6)
        kept = {}
        for name, fn in paths.items():
            before = sys.getallocatedblocks()
            with contexts.get(name, contextlib.nullcontext)():
                for _ in range(2000):
                    fn()
            torch.cuda.synchronize()
            kept[name] = sys.getallocatedblocks() - before
        lin = statistics.median(times["F.linear"][1])
        print(f"\n{M}x{N}x{K} bf16, {args.reps} bursts x {args.calls} calls, median per call (us)")
        print(f"{'path':<26} {'enqueue wall':>12} {'enqueue CPU':>12} {'end-to-end':>11} "
              f"{'CPU / F.linear':>15} {'blocks kept':>12}")
        for name in paths:
            ew, ec, e2e = (statistics.median(v) for v in times[name])
            print(f"{name:<26} {ew:>12.2f} {ec:>12.2f} {e2e:>11.2f} {ec / lin:>15.2f} "
                  f"{kept[name]:>12}")
            if out:
                out.write(json.dumps({"card": card, "torch": torch.__version__, "M": M, "N": N,
                                      "K": K, "dtype": "bfloat16", "path": name,
                                      "calls": args.calls * args.reps,
                                      "enqueue_wall_us": round(ew, 3),
                                      "enqueue_cpu_us": round(ec, 3),
                                      "end_to_end_us": round(e2e, 3),
                                      "python_blocks_kept_2000_calls": kept[name]}) + "\n")
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
