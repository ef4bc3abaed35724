"""On a GPU host: call ``tirx_gemm.matmul(a, b)`` as a PyTorch user would, for every case of
the shape suite (fp16 and bf16), from a bundle (``TIRX_GEMM_BUNDLE``), and compare with
``torch.nn.functional.linear(a, b)`` computed in fp32. One line per case; exit 1 if any
case is refused or wrong. Tolerances are the project's (tirx_gemm.numerics).

    TIRX_GEMM_BUNDLE=build/bundle-suite python lab/tools/matmul_smoke.py [SUITE]
"""
from __future__ import annotations

import sys

import torch

import tirx_gemm
from tirx_gemm import numerics
from tirx_gemm.op import suite


def main(argv) -> int:
    s = suite.load_suite(argv[0] if argv else None)
    bad = 0
    gen = torch.Generator(device="cuda").manual_seed(0)
    for entry, dtype in s.cases():
        M, N, K = entry.shape
        tdt = getattr(torch, dtype)
        a = (torch.randn(M, K, device="cuda", generator=gen) * K ** -0.25).to(tdt)
        b = (torch.randn(N, K, device="cuda", generator=gen) * K ** -0.25).to(tdt)
        try:
            d = tirx_gemm.matmul(a, b)
        except Exception as e:  # noqa: BLE001 - a refusal is a result here
            print(f"REFUSED {entry.label:28} {dtype:9} {type(e).__name__}: {str(e).splitlines()[0]}")
            bad += 1
            continue
        ref = torch.nn.functional.linear(a.float(), b.float())
        cmp = numerics.compare_np(d.float().cpu().numpy(), ref.cpu().numpy(), dtype=dtype)
        print(f"{'ok' if cmp.ok else 'WRONG':7} {entry.label:28} {dtype:9} {cmp.summary()}", flush=True)
        bad += not cmp.ok
    print(f"{bad} of {len(s.cases())} cases refused or wrong")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
