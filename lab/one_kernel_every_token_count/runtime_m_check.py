"""On a GPU host: one bundle, every token count. For each runtime-M kernel's layer (N, K)
in the bundle (``TIRX_GEMM_BUNDLE``), call ``tirx_gemm.matmul(a, b)`` at many M -- tile
edges, odd counts, both sides of every place where matmul.variants changes kernel -- as a
decoder would, then in a shuffled order (a larger M grows v11's workspace, a smaller one
reuses it), and compare each with ``F.linear`` in fp32 (tirx_gemm.numerics rules). Also
checks that no call builds or exports anything (no TVM on the GPU host) and that the
results are the same when the calls are queued without a sync in between (async).

    TIRX_GEMM_BUNDLE=B python lab/one_kernel_every_token_count/runtime_m_check.py [--out FILE.jsonl]

One line per case, a summary, exit 1 if any case is refused or wrong.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

import tirx_gemm
from tirx_gemm import numerics
from tirx_gemm.compile.bundle import load_manifest
from tirx_gemm.bundle_format import code_git_sha
from tirx_gemm.gitinfo import git_sha
from tirx_gemm.matmul import bundle_path, variants

EDGE_MS = (1, 2, 7, 8, 9, 16, 31, 33, 64, 77, 78, 127, 128, 129, 255, 256, 257, 333, 511,
           512, 513, 1000, 1023, 1025, 2049, 4096)


def layers(bundle: Path):
    """(N, K, dtype) of every runtime-M kernel in the bundle."""
    out = []
    for e in load_manifest(bundle):
        kw = e.get("kwargs") or {}
        if kw.get("RUNTIME_M") and not kw.get("RUNTIME_NK"):  # a layer's own kernels
            out.append((e["N"], e["K"], kw.get("dtype", "float16")))
    return sorted(set(out))


def ms_for(N, K, dtype, arch, sms):
    ms = set(EDGE_MS)
    for _, _, lo, hi in variants(N, K, dtype, arch, sms):
        ms.update({lo, hi, hi + 1})
    return sorted(m for m in ms if m <= 8192)


def main(argv) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    bundle = bundle_path()
    if bundle is None:
        print("set TIRX_GEMM_BUNDLE to a bundle exported with --suite")
        return 2
    from tirx_gemm.run.device import check_device
    info = check_device("sm_90a", query_smi=False)
    gen = torch.Generator(device="cuda").manual_seed(0)
    cases, bad, rows = 0, 0, []
    t0 = time.time()
    for N, K, dtype in layers(bundle):
        tdt = getattr(torch, dtype)
        ms = ms_for(N, K, dtype, "sm_90a", info["sm_count"])
        order = ms + random.Random(N * 7 + K).sample(ms, len(ms))  # then shuffled
        inputs = {}
        for M in ms:
            a = (torch.randn(M, K, device="cuda", generator=gen) * K ** -0.25).to(tdt)
            b = (torch.randn(N, K, device="cuda", generator=gen) * K ** -0.25).to(tdt)
            inputs[M] = (a, b)
        # queue every call of the pass without waiting, then check them all
        for pass_, seq in (("ascending", order[:len(ms)]), ("shuffled", order[len(ms):])):
            outs = []
            for M in seq:
                a, b = inputs[M]
                try:
                    outs.append((M, tirx_gemm.matmul(a, b)))
                except Exception as e:  # noqa: BLE001 - a refusal is a result here
                    print(f"REFUSED {M}x{N}x{K} {dtype}: {type(e).__name__}: "
                          f"{str(e).splitlines()[0]}", flush=True)
                    bad += 1
                    cases += 1
            tirx_gemm.matmul.synchronize()
            for M, d in outs:
                a, b = inputs[M]
                ref = torch.nn.functional.linear(a.float(), b.float())
                cmp = numerics.compare_np(d.float().cpu().numpy(), ref.cpu().numpy(),
                                          dtype=dtype)
                cases += 1
                bad += not cmp.ok
                rows.append({"M": M, "N": N, "K": K, "dtype": dtype, "pass": pass_,
                             "ok": bool(cmp.ok), "summary": cmp.summary()})
                if not cmp.ok or pass_ == "ascending":
                    print(f"{'ok' if cmp.ok else 'WRONG':6} {pass_:9} {M}x{N}x{K} {dtype} "
                          f"{cmp.summary()}", flush=True)
    import tirx_gemm.matmul as mm
    kernels = len(mm._kernels)
    print(f"{cases - bad} of {cases} calls correct ({bad} refused or wrong) over "
          f"{len(layers(bundle))} layers, {kernels} kernels loaded, "
          f"{time.time() - t0:.0f} s; device {info['name']}")
    if args.out:
        rec = {"what": "runtime-M check", "device": info["name"], "torch": torch.__version__,
               "date": time.strftime("%Y-%m-%d"), "git_sha": code_git_sha(bundle) or git_sha(), "cases": cases,
               "bad": bad, "kernels_loaded": kernels, "rows": rows}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(rec) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
