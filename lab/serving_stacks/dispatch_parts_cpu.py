#!/usr/bin/env python
"""Where the dispatcher path's per-call cost goes, on the CPU (no GPU): the op's Python code and
torch's boxed call, each timed alone, in one process, interleaved.

The kernel launch is replaced by a no-op (a stub in tirx_gemm.op.matmul's call cache for a CPU
shape), so what is timed is everything around it: matmul's lean path (the cache lookup, the
alignment and autograd checks, the output's allocation) and, for the dispatcher path,
``torch.ops.tirx_gemm.matmul`` with its backward registered through torch_op.register_autograd,
its fast path taken for CPU tensors (torch_op's backend key set to CPU here). Paths:

  direct                 tirx_gemm.op.matmul.matmul(a, b), the stub launch
  dispatcher             torch_op.OP(a, b) -> torch_op's Autograd kernel -> the same
  dispatcher ._op        the op's C++ callable, without the OpOverload Python wrapper
  boxed no-op            an op with the same schema whose Autograd kernel (with the key set) returns a
  boxed no-op no keyset  the same without the key set argument
  boxed no-op 2 args     the same with a (Tensor a, Tensor b) schema
  boxed new tensor       the no-op returning a.new_empty((M, N))
  new_empty              the allocation alone
  kernel body            torch_op's Autograd kernel called from Python (key set made once)

Median per call of --reps bursts of --calls calls (thread CPU time and wall); one JSON line per path.

  python lab/serving_stacks/dispatch_parts_cpu.py [--calls 1000] [--reps 15] [--out F.jsonl]
"""
import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch
    import tirx_gemm.op.matmul as MM
    from tirx_gemm import torch_op
    from tirx_gemm.op import autograd as AG

    M, N, K = 1, 1024, 1024
    a = torch.randn(M, K, dtype=torch.bfloat16)
    b = torch.randn(N, K, dtype=torch.bfloat16)
    MM._torch = torch  # as after a first call
    MM._calls[(a.shape, b.shape, a.dtype, a.get_device(), None)] = MM._Call(
        lambda a, b, out: None, (), "stub", (M, N))
    torch_op._BACKEND_KEYS = (torch._C.DispatchKey.CPU,)  # the fast path, for CPU tensors
    torch_op.register_autograd(torch_op.NAME, AG._backward_matmul, setup_context=AG._setup_matmul)

    lib = torch.library.Library("tirx_parts_cpu", "DEF")
    schema = str(torch_op.OP._schema).split("::matmul", 1)[1]
    for name, sch in (("ks", schema), ("noks", schema), ("new", schema),
                      ("two", "(Tensor a, Tensor b) -> Tensor")):
        lib.define(name + sch)
    lib.impl("ks", lambda ks, a, b, *rest: a, "Autograd", with_keyset=True)
    lib.impl("noks", lambda a, b, *rest: a, "Autograd")
    lib.impl("new", lambda ks, a, b, *rest: a.new_empty((M, N)), "Autograd", with_keyset=True)
    lib.impl("two", lambda a, b: a, "Autograd")
    box = torch.ops.tirx_parts_cpu
    active = [line for line in torch._C._dispatch_dump(torch_op.NAME).splitlines()
              if line.startswith("Autograd[alias]:")]
    assert active and "torch_op.py" in active[0], active  # the fast path's kernel is the one
    # torch_op's Autograd kernel itself, as the dispatcher calls it (the key set made once)
    ks = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    kernel = torch_op._matmul_kernel(None, {ks.raw_repr(): True}, lambda k: True)
    paths = {
        "direct": lambda: MM.matmul(a, b),
        "dispatcher": lambda: torch_op.OP(a, b),
        "dispatcher ._op": (lambda f=torch_op.OP._op: f(a, b)),
        "boxed no-op": lambda: box.ks(a, b),
        "boxed no-op no keyset": lambda: box.noks(a, b),
        "boxed no-op 2 args": lambda: box.two(a, b),
        "boxed new tensor": lambda: box.new(a, b),
        "new_empty": lambda: a.new_empty((M, N)),
        "kernel body": lambda: kernel(ks, a, b),
    }
    for fn in paths.values():
        for _ in range(3 * args.calls):
            fn()
    times = {n: ([], []) for n in paths}
    for _ in range(args.reps):
        for name, fn in paths.items():
            c0, w0 = time.thread_time(), time.perf_counter()
            for _ in range(args.calls):
                fn()
            w1, c1 = time.perf_counter(), time.thread_time()
            times[name][0].append((c1 - c0) / args.calls * 1e6)
            times[name][1].append((w1 - w0) / args.calls * 1e6)
    model = platform.machine()
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    card = f"CPU, {model}, torch {torch.__version__} (stub launch)"
    print(card)
    out = open(args.out, "a") if args.out else None
    for name in paths:
        cpu, wall = (statistics.median(v) for v in times[name])
        print(f"  {name:<24} cpu {cpu:6.2f} us  wall {wall:6.2f} us")
        if out:
            out.write(json.dumps({"card": card, "M": M, "N": N, "K": K, "dtype": "bfloat16",
                                  "path": name, "calls": args.calls * args.reps,
                                  "cpu_us": round(cpu, 3), "wall_us": round(wall, 3)}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
