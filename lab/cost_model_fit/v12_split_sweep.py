"""v12's SPLIT_K on the H200: a CTA per unit, with and without K splits.

SPLIT_K=1 is the non-persistent path (S x tiles CTAs, no tile walk; a small ring lets
several CTAs share an SM, one's epilogue under another's loads). SPLIT_K=S>1 cuts each
tile's K into S units reduced by v11's "spread" protocol (each unit sums its 1/S of the
tile from all S slabs, in split order): small tiles (64x32 .. 128x128) and swap-AB tiles
with splits are what cuBLAS launches at the deep-K and decode shapes where matmul trails
(lab/cublas_kernels/records/cublas_kernels_h200.jsonl).

    python lab/cost_model_fit/v12_split_sweep.py export --out .gpu/v12s     # here (bf16)
    python lab/cost_model_fit/v12_split_sweep.py run --bundle .gpu/v12s --out F.jsonl [--pairwise]  # GPU

NP: SPLIT_K=1 kernels with RUNTIME_M and RUNTIME_NK (one kernel, every shape), an
explicit ring depth, PDL; each runs at every shape of SHAPES. SPLITS: per shape, SPLIT_K>1
kernels with RUNTIME_M (N and K fixed: the split of K is built in). Per (shape, kernel):
checked against F.linear (tirx_gemm.numerics' rules), run twice and compared bit for bit,
the counters zero after, then timed as CUDA-graph replays and eager back-to-back launches
beside torch.mm in the same run (inputs rotated past the L2: v12_sweep._inputs). One JSON
line per shape.

Lab-only keywords: the ``--only`` suffixes ``l`` (L2_PROMO), ``c2n``/``c2nq`` (PAIR_ALONG="N"),
``e`` (EPI_SPREAD) and ``mL`` (MMA_LAG) build keywords that left steps/sm90a/hgemm_v12.py;
apply the study's patch first (lab/mma_lag_and_l2_hints/patches/tma_hints.patch,
lab/cta_clusters/patches/pair_along_n.patch, lab/fused_epilogues/patches/epi_spread.patch,
lab/mma_lag_and_l2_hints/patches/mma_lag.patch; lab/tools/lab_patches.py), else export stops
with a one-line error naming it.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import lab_patches  # noqa: E402
import v12_sweep as V  # noqa: E402  (the inputs, the check and the timers)

# (BLK_M, BLK_N, SWAP_AB, PIPE_DEPTH): SPLIT_K=1, RUNTIME_M + RUNTIME_NK, PDL
NP = ((64, 8, True, 8), (64, 16, True, 8), (64, 48, True, 8), (64, 64, True, 6),
      (64, 80, True, 6), (64, 16, False, 6), (64, 32, False, 6), (64, 64, False, 6),
      (64, 128, False, 4), (128, 64, False, 4), (128, 128, False, 4), (128, 192, False, 3))
# `export --pairs`: swap-AB as CTA pairs along the weight's rows sharing the token tile by
# multicast (CLUSTER=2, persistent, no PDL: built before v12 pairs took it), beside the same
# tiles alone and the NP kernels (cuBLAS runs its decode tiles in clusters of 2-4 along
# the weight: lab/cublas_kernels/records/cublas_kernels_h200.jsonl)
SWAP_PAIRS = ((64, 16), (64, 32), (64, 48), (64, 64), (64, 80), (64, 96), (128, 16),
              (128, 48), (128, 64))
# shape -> ((BLK_M, BLK_N, SWAP_AB, SPLIT_K), ...): tiles x S <= 132 (all units resident)
SPLITS = {
    (128, 128, 65536): ((64, 32, False, 16), (64, 64, False, 32), (64, 128, False, 64),
                        (128, 64, False, 64), (128, 128, False, 128)),
    (128, 256, 32768): ((64, 32, False, 8), (64, 64, False, 16), (64, 128, False, 32),
                        (128, 64, False, 32)),
    (256, 256, 16384): ((64, 32, False, 4), (64, 64, False, 8), (64, 128, False, 16),
                        (128, 64, False, 16)),
    (384, 128, 12288): ((64, 32, False, 5), (64, 64, False, 11), (64, 128, False, 22),
                        (128, 64, False, 22)),
    (128, 4096, 14336): ((128, 64, False, 2), (64, 128, False, 2), (128, 128, False, 4)),
    (32, 4096, 14336): ((128, 32, True, 4), (64, 32, True, 2), (128, 32, True, 2)),
    (48, 4096, 14336): ((128, 48, True, 4), (64, 48, True, 2)),
    (1, 4096, 4096): ((64, 8, True, 2), (128, 8, True, 4)),
    (1, 8192, 8192): ((128, 8, True, 2),),
    (8, 14336, 4096): ((128, 8, True, 1),),
    (64, 6144, 4096): ((128, 64, True, 2),),
    (128, 6144, 4096): ((128, 96, False, 2),),
    (1000, 1000, 1000): ((128, 128, False, 2),),
}
# the shapes every NP kernel runs at: SPLITS' and the suite's other short or mid ones
SHAPES = tuple(SPLITS) + ((16, 14336, 4096), (48, 14336, 4096), (77, 7168, 2048),
                          (1024, 1024, 1024), (512, 512, 512), (640, 640, 640),
                          (1536, 1536, 1536), (2304, 2304, 2304), (128, 256, 192),
                          (256, 512, 192), (2048, 2048, 256), (4096, 4096, 64),
                          (4096, 4096, 512), (128, 4096, 4096))


def np_label(bm, bn, swap, depth):
    return f"np{bm}x{bn}" + ("w" if swap else "") + f"d{depth}"


def split_label(bm, bn, swap, s):
    return f"{bm}x{bn}" + ("w" if swap else "") + f"s{s}"


def _kw(bm, bn, swap, dtype):
    kw = {"BLK_M": bm, "BLK_N": bn, "SM_COUNT": 132, "PDL": True, "RUNTIME_M": True}
    if swap:
        kw["SWAP_AB"] = True
    if dtype != "float16":
        kw["dtype"] = dtype
    return kw


def parse_only(text: str) -> dict:
    """``M,N,K:CAND+...;...`` -> {shape: ((BLK_M, BLK_N, SWAP_AB, KIND), ...)}: a SPLITS
    of its own (and no NP kernels), for a focused re-run. CAND is ``BMxBN[w]`` (w: SWAP_AB)
    and then ``sS`` (SPLIT_K=S), ``nD`` (the non-persistent kernel, SPLIT_K=1, a ring of
    D stages), ``p`` (persistent, data-parallel), ``q`` (the same with PDL) or ``k``
    (persistent with STREAM_K), and an ``x`` for the split and non-persistent kernels
    without PDL, then an ``l`` for 256-byte L2 promotion of both operands' TMA loads
    (L2_PROMO); ``BMxBNc2p`` is the persistent CTA pair (CLUSTER=2, no PDL), ``c2n`` the
    pair along the MMA's N (PAIR_ALONG="N", no PDL) and ``c2nq`` the same with PDL; a
    trailing ``t`` stores a swap-AB tile by TMA (SWAP_TMA); KIND is that text ("s2", "n8x",
    "ql", "c2p", "c2nqt", ...), every kernel with RUNTIME_M and N and K fixed."""
    out = {}
    for part in filter(None, text.split(";")):
        shape, cands = part.split(":")
        got = []
        for c in cands.split("+"):
            m = re.fullmatch(r"(\d+)x(\d+)(w?)(?:s(\d+)|(n\d+|p|q|k|c2p|c2nq|c2n))(x?)(l?)(e?)(f?)"
                             r"(m\d)?(t?)", c)
            if m is None:
                raise ValueError(f"--only: {c!r} is not BMxBN[w] then sS, nD, p, q, k or c2p "
                                 "(and x: without PDL; l: 256-byte L2 promotion; e: "
                                 "EPI_SPREAD; f: PREFETCH_MAPS; mL: MMA_LAG=L)")
            bm, bn, swap, split, kind, off, promo, spread, pf, lag, tma = m.groups()
            kind = f"s{split}" if split else kind
            got.append((int(bm), int(bn), swap == "w",
                        kind + off + promo + spread + pf + (lag or "") + tma))
        out[tuple(int(x) for x in shape.split(","))] = tuple(got)
    return out


def _focus_kwargs(bm, bn, swap, s, dt):
    """The build keywords of a parse_only candidate (``s``: "sS", "nD", "p", "q" or "k",
    a trailing "x" building it without PDL)."""
    from tirx_gemm import splitk
    kw = _kw(bm, bn, swap, dt)
    s = f"s{s}" if isinstance(s, int) else s  # SPLITS' entries: S itself
    if s.endswith("t"):
        kw["SWAP_TMA"] = True
        s = s[:-1]
    lag = re.search(r"m(\d)$", s)
    if lag:
        kw["MMA_LAG"] = int(lag.group(1))
        s = s[:lag.start()]
    if s.endswith("f"):
        kw["PREFETCH_MAPS"] = True
        s = s[:-1]
    if s.endswith("e"):
        kw["EPI_SPREAD"] = True
        s = s[:-1]
    if s.endswith("l"):
        kw["L2_PROMO"] = "L2::256B"
        s = s[:-1]
    if s == "c2p":
        kw.pop("PDL")
        return {**kw, "CLUSTER": 2}
    if s in ("c2n", "c2nq"):  # the pair along the MMA's N, sharing its A tile
        if s == "c2n":
            kw.pop("PDL")
        return {**kw, "CLUSTER": 2, "PAIR_ALONG": "N"}
    if s.endswith("x"):
        kw.pop("PDL")
        s = s[:-1]
    if s.startswith("s"):
        split = int(s[1:])
        return {**kw, "SPLIT_K": split, "L2_GROUP": splitk.l2_group_for(split)}
    if s.startswith("n"):
        return {**kw, "SPLIT_K": 1, "PIPE_DEPTH": int(s[1:])}
    if s == "q":
        return kw
    kw.pop("PDL", None)  # the persistent kernels as matmul builds them past PDL_MAX_US
    return {**kw, "STREAM_K": True} if s == "k" else kw


def requests(dtypes, only: dict | None = None, pairs: bool = False):
    from tirx_gemm import registry, splitk
    step = registry.get("v12", "sm_90a")
    reqs = []
    for dt in dtypes:
        for bm, bn in (SWAP_PAIRS if pairs else ()):
            for cluster in (1, 2):
                kw = {**_kw(bm, bn, True, dt), "RUNTIME_NK": True}
                kw.pop("PDL")
                if cluster == 2:
                    kw["CLUSTER"] = 2
                reqs.append((step, (128, 256, 256), kw))
        if pairs:
            for bm, bn, swap, depth in NP:
                if swap:
                    reqs.append((step, (128, 256, 256), {**_kw(bm, bn, swap, dt),
                                                         "RUNTIME_NK": True, "SPLIT_K": 1,
                                                         "PIPE_DEPTH": depth}))
            continue
        for bm, bn, swap, depth in (() if only else NP):
            reqs.append((step, (128, 256, 256), {**_kw(bm, bn, swap, dt), "RUNTIME_NK": True,
                                                 "SPLIT_K": 1, "PIPE_DEPTH": depth}))
        for (M, N, K), cands in (only or SPLITS).items():
            for bm, bn, swap, s in cands:
                reqs.append((step, (M, N, K), _focus_kwargs(bm, bn, swap, s, dt)))
    return reqs


def export(out: Path, dtypes, only: dict | None = None, pairs: bool = False) -> int:
    from tirx_gemm.compile import bundle
    reqs = requests(dtypes, only, pairs)
    lab_patches.require([kw for _, _, kw in reqs])
    print(f"{len(reqs)} kernels")
    bundle.export(reqs, out, ffi_wheel_python="3.12")
    return 0


def _label_of(kw):
    extra = (("e" if kw.get("EPI_SPREAD") else "") + ("f" if kw.get("PREFETCH_MAPS") else "")
             + (f"m{kw['MMA_LAG']}" if kw.get("MMA_LAG", 1) != 1 else "")
             + ("t" if kw.get("SWAP_TMA") else ""))
    if "SPLIT_K" not in kw and not kw.get("RUNTIME_NK"):  # persistent, data-parallel or
        # stream-K (--only): p / k
        return (f"{kw['BLK_M']}x{kw['BLK_N']}" + ("w" if kw.get("SWAP_AB") else "")
                + ("c2" if kw.get("CLUSTER") == 2 else "")
                + ("n" if kw.get("PAIR_ALONG") == "N" else "")
                + ("k" if kw.get("STREAM_K") else "q" if kw.get("PDL") else "p")
                + ("l" if kw.get("L2_PROMO") else "") + extra)
    if "SPLIT_K" not in kw:  # a persistent swap-AB tile, alone or paired (--pairs)
        return (f"{kw['BLK_M']}x{kw['BLK_N']}" + ("w" if kw.get("SWAP_AB") else "")
                + ("c2" if kw.get("CLUSTER") == 2 else "") + extra)
    off = "" if kw.get("PDL") else "x"  # the split and non-persistent kernels: PDL unless x
    if kw.get("RUNTIME_NK") or kw.get("SPLIT_K") == 1:
        return (np_label(kw["BLK_M"], kw["BLK_N"], bool(kw.get("SWAP_AB")), kw["PIPE_DEPTH"])
                + off + extra)
    return (split_label(kw["BLK_M"], kw["BLK_N"], bool(kw.get("SWAP_AB")), kw["SPLIT_K"])
            + off + extra)


def run(bundle: Path, out: Path, dtypes, budget_s: float, repeat: int = 1,
        pairwise: bool = False) -> int:
    import torch
    from tirx_gemm import registry
    from tirx_gemm.compile.bundle import load_manifest
    from tirx_gemm.gitinfo import git_sha
    from tirx_gemm.bundle_format import code_git_sha
    from tirx_gemm.run.loader import load_kernel
    t0 = time.time()
    step = registry.get("v12", "sm_90a")
    kernels = {}  # (dtype, shape or None, label) -> (kernel, kwargs)
    for e in load_manifest(bundle):
        kw = e.get("kwargs") or {}
        shape = None if kw.get("RUNTIME_NK") else (e["M"], e["N"], e["K"])
        kernels[(kw.get("dtype", "float16"), shape, _label_of(kw))] = \
            (load_kernel(str(bundle / e["lib"])), kw)
    dev = torch.cuda.get_device_name()
    bad = 0
    shapes = sorted({(e["M"], e["N"], e["K"]) for e in load_manifest(bundle)
                     if not (e.get("kwargs") or {}).get("RUNTIME_NK")}) \
        if all(s is not None for _, s, _ in kernels) else SHAPES
    for (M, N, K) in [s for s in shapes for _ in range(repeat)]:
        for dtype in dtypes:
            if time.time() - t0 > budget_s:
                print(f"budget of {budget_s:.0f} s spent: stopping before {M}x{N}x{K}")
                return 1 if bad else 0
            ins, ref, pick, t_torch = V._inputs(M, N, K, dtype)
            torch_fns = [lambda a=a, b=b, d=d: torch.mm(a, b.t(), out=d) for a, b, d in pick]
            t_torch_eager = V._eager_time(torch_fns)
            rec = {"M": M, "N": N, "K": K, "dtype": dtype, "device": dev,
                   "timing": "interleaved-pairwise" if pairwise else "sequential",
                   "torch": torch.__version__, "git_sha": code_git_sha(bundle) or git_sha(),
                   "date": time.strftime("%Y-%m-%d"), "torch_ms": t_torch,
                   "torch_eager_ms": t_torch_eager, "candidates": {}}
            line = []
            for (dt, shape, name), (kern, kw) in sorted(kernels.items(), key=str):
                if dt != dtype or shape not in (None, (M, N, K)):
                    continue
                if kw.get("SWAP_AB") and shape is None and M > kw["BLK_N"]:
                    continue  # a run-time-shape swap-AB kernel: one token tile, M within it
                ws = tuple(torch.zeros(sh, dtype=getattr(torch, d), device="cuda")
                           for _, sh, d in step.workspace_specs(M, N, K, kw))
                a, b, d = ins[0]
                try:
                    r, ok = V.check_twice(kern, a, b, d, ws, ref, dtype,
                                          f"v12 {name} {M}x{N}x{K}")
                except Exception as exc:  # noqa: BLE001 - recorded
                    rec["candidates"][name] = {"error": str(exc).splitlines()[0]}
                    line.append(f"{name}:ERROR")
                    bad += 1
                    continue
                if not ok:
                    rec["candidates"][name] = r
                    line.append(f"{name}:WRONG")
                    bad += 1
                    continue
                fns = [lambda a=a, b=b, d=d, k=kern, ws=ws: k(a, b, d, *ws) for a, b, d in pick]
                if pairwise:  # alternated with torch.mm alone after a warm-up (matmul's
                    # protocol: the clock settles to the pair's power, not the set's)
                    r["torch_ms"], r["ms"] = V._graphs_interleaved([torch_fns, fns])
                    r["ratio"] = r["torch_ms"] / r["ms"]
                else:
                    r["ms"] = V._graph_time(fns)
                    r["ratio"] = t_torch / r["ms"]
                r["eager_ms"] = V._eager_time(fns)
                r["eager_ratio"] = t_torch_eager / r["eager_ms"]
                rec["candidates"][name] = r
                line.append(f"{name}:{r['ratio']:.2f}/{r['eager_ratio']:.2f}")
            print(f"{M}x{N}x{K:<6} {dtype:8} torch {t_torch * 1e3:7.1f} us | {' '.join(line)}",
                  flush=True)
            with open(out, "a") as f:
                f.write(json.dumps(rec) + "\n")
            del ins, ref
    print(f"done in {time.time() - t0:.0f} s; device {dev}; {bad} wrong or failed")
    return 1 if bad else 0


def main(argv) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--out", type=Path, required=True)
    e.add_argument("--dtypes", default="bfloat16")
    e.add_argument("--pairs", action="store_true",
                   help="SWAP_PAIRS alone and as CLUSTER=2 pairs, with the swap NP kernels")
    e.add_argument("--only", default=None,
                   help="M,N,K:BMxBNsS+...;... a focused bundle (no NP kernels)")
    r = sub.add_parser("run")
    r.add_argument("--bundle", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--dtypes", default="bfloat16")
    r.add_argument("--budget-s", type=float, default=420)
    r.add_argument("--repeat", type=int, default=1, help="each shape this many times")
    r.add_argument("--pairwise", action="store_true",
                   help="time each kernel's graph alternated with torch.mm's alone (the "
                        "interleaved protocol of matmul_graph_times.py) instead of one after "
                        "the other")
    a = p.parse_args(argv)
    if a.cmd == "export":
        return export(a.out, a.dtypes.split(","), parse_only(a.only) if a.only else None,
                      a.pairs)
    return run(a.bundle, a.out, a.dtypes.split(","), a.budget_s, a.repeat, a.pairwise)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
