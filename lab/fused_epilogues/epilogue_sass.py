"""where the fused epilogue's cost is, from the SASS of builds (no GPU needed).

Builds sm_90a v12 (and, with --v10, v10) bf16 at one tile with each bias+activation
epilogue and the plain kernel, with the keywords matmul gives them (RUNTIME_M/NK, the
H200's 132-SM pool), and prints per build: registers, spills, and the SASS opcodes the
epilogue adds over the plain kernel (MUFU.*, FFMA, FMUL, FADD, LDG ...), divided by the
accumulator elements each consumer thread finishes per tile (BLK_N/2): the epilogue's
instruction count per element. Also where the bias loads sit relative to the tile's final
wgmma wait (wait_group 0): how many global loads come before it and after it.

    .venv/bin/python lab/fused_epilogues/epilogue_sass.py [--tile 128x256] [--v10] [--bias-smem]
        [--json FILE]

--bias-smem adds each bias case built with BIAS_SMEM=True (the bias staged in shared memory by the
producer's second warp; the consumers read it with LDS instead of holding it in registers).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CASES = [{}, {"BIAS": "bfloat16"}, {"ACT": "relu", "BIAS": "bfloat16"},
         {"ACT": "silu", "BIAS": "bfloat16"}, {"ACT": "gelu", "BIAS": "bfloat16"},
         {"ACT": "gelu_tanh", "BIAS": "bfloat16"}]
ARITH = ("LDS", "MUFU", "FFMA", "FMUL", "FADD", "FMNMX", "FSETP", "FSEL", "LDG", "F2FP", "PRMT",
         "SHF", "LOP3", "IMAD", "ISETP", "SEL", "FCHK", "CALL", "BSSY", "BRA", "STL", "LDL")


def group(counts: dict) -> dict:
    out: dict = {}
    for op, n in counts.items():
        base = op.split(".")[0]
        key = op if base in ("MUFU", "LDG") else base
        out[key] = out.get(key, 0) + n
    return out


def bias_placement(sass: str) -> dict:
    """Where the bias loads are against the tile's final wgmma wait (wait_group 0:
    ``WARPGROUP.DEPBAR.LE gsb0, 0x0``): loads before it overlap the last wgmmas, loads
    after it sit in the epilogue's critical path."""
    lines = sass.splitlines()
    final = [i for i, s in enumerate(lines) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in s]
    ldg = [i for i, s in enumerate(lines) if re.search(r"\bLDG\.E", s)]
    if not ldg or not final:
        return {"ldg": len(ldg), "final_waits": len(final)}
    return {"ldg": len(ldg), "before_final_wait": sum(i < final[0] for i in ldg),
            "after_final_wait": sum(i > final[0] for i in ldg)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tile", default="128x256")
    ap.add_argument("--v10", action="store_true", help="also v10 (ping-pong) builds")
    ap.add_argument("--bias-smem", action="store_true",
                    help="also each bias case with BIAS_SMEM=True (v12 only)")
    ap.add_argument("--json", help="write the table as JSON here")
    args = ap.parse_args(argv)
    bm, bn = (int(x) for x in args.tile.split("x"))
    from tirx_gemm import registry
    from tirx_gemm import epilogue as E
    from tirx_gemm.compile.api import build_many
    v12 = registry.get("v12", "sm_90a")
    base = {"dtype": "bfloat16", "RUNTIME_M": True, "RUNTIME_NK": True, "SM_COUNT": 132,
            "BLK_M": bm, "BLK_N": bn}
    reqs = [(v12, (1024, 1024, 1024), {**base, **c}) for c in CASES]
    if args.bias_smem:
        reqs += [(v12, (1024, 1024, 1024), {**base, **c, "BIAS_SMEM": True})
                 for c in CASES if c.get("BIAS")]
    if args.v10:
        v10 = registry.get("v10", "sm_90a")
        b10 = {"dtype": "bfloat16", "RUNTIME_M": True, "SM_COUNT": 132}
        reqs += [(v10, (1024, 1024, 1024), {**b10, **c}) for c in CASES]
    res = build_many(reqs)
    rows = []
    plain = {}
    for (step, _, kw), r in zip(reqs, res):
        if isinstance(r, Exception):
            print(f"{step.id} {E.tag(kw)}: FAILED {r}")
            continue
        g = group(r.sass_counts)
        if E.is_plain(kw):
            plain[step.id] = g
        per = (bn // 2) if step.id == "v12" else 128  # accumulators per consumer thread
        p = plain.get(step.id, {})
        delta = {k: g.get(k, 0) - p.get(k, 0) for k in sorted(set(g) | set(p))
                 if any(k.startswith(a) for a in ARITH) and g.get(k, 0) != p.get(k, 0)}
        name = E.tag(kw) + ("+bias_smem" if kw.get("BIAS_SMEM") else "")
        row = {"step": step.id, "epilogue": name, "registers": r.registers,
               "spill_stores": r.spill_stores, "spill_loads": r.spill_loads,
               "stack": r.stack_bytes, "delta_vs_plain": delta,
               "per_element": {k: round(v / per, 2) for k, v in delta.items()},
               "bias": bias_placement(Path(r.sass_path).read_text())}
        rows.append(row)
        print(f"{step.id:4} {row['epilogue']:24} regs {r.registers} spill "
              f"{r.spill_stores}/{r.spill_loads} stack {r.stack_bytes}")
        print(f"     +SASS vs plain: {delta}")
        print(f"     per element ({per}/thread/tile): {row['per_element']}")
        print(f"     bias loads: {row['bias']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
