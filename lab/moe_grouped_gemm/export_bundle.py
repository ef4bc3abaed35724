"""Export the v14 kernels the MoE study needs into a bundle (build machine, TVM).

    python lab/moe_grouped_gemm/export_bundle.py \
        --suite lab/moe_grouped_gemm/suites/moe_experts.json --dtypes bfloat16 --tests --out DIR

--suite: every kernel tirx_gemm.op.grouped.suite_builds lists for the suite's grouped entries
(one per tile the pick takes over the entry's token counts, M at run time; an entry's
"epilogues" and "fp8" keys add its fused and fp8 kernels, as for `tirx-gemm export --suite`);
--tests: the kernels tests/test_gpu_grouped.py asks for (TEST_CALLS, its calls' rows, experts
and shapes; FUSED_CALLS and SWIGLU_CALLS, the calls with a fused epilogue, through the op's
grouped.fused_call; its FUSED_CASES, launched directly).
--own-tokens: each suite entry's own token counts only ("all_m": false), the kernels a bench of
those counts launches, not every tile a call of any count could take.
--variants FILE: the tile variants bench_grouped.py --variants times at that file's cases.
--fp8: the fp8 kernels (v14 FP8_BLOCK) of tests/test_gpu_grouped.py's FP8_CASES and of
bench_grouped_fp8.py's default layers and token counts (FP8_TEST_CALLS, FP8_BENCH).
--ffi-wheel PYVER: the apache-tvm-ffi wheel for the GPU host's Python too (as tirx-gemm export's).
--list prints the requests without building. The export adds to the bundle (locked, atomic).
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tirx_gemm import registry  # noqa: E402
from tirx_gemm.op import grouped as G  # noqa: E402
from tirx_gemm.op.keywords import NOMINAL_M  # noqa: E402

# (rows, E, N, K, dtypes, layout) of tests/test_gpu_grouped.py's launches
TEST_CALLS = (
    [(r, 8, 1024, 512, ("bfloat16", "float16"), "contiguous") for r in (1, 7, 64, 333, 2048)]
    + [(r, 128, 256, 128, ("bfloat16", "float16"), "contiguous")
       for r in (1, 7, 64, 333, 2048)]
    + [(r, 8, 1024, 512, ("bfloat16",), "contiguous") for r in (300, 256, 512, 128)]
    + [(8 * 40, 8, 1024, 512, ("bfloat16",), "masked")]
    # Experts: Mixtral-style (E 8, top-2, hidden 512, FFN 1024) at 1, 16, 64, 300 tokens
    + [(t * 2, 8, 2048, 512, ("bfloat16",), "contiguous") for t in (1, 16, 64, 300)]
    + [(t * 2, 8, 512, 1024, ("bfloat16",), "contiguous") for t in (1, 16, 64, 300)]
    # Qwen3-MoE-style (E 32, top-4, hidden 512, FFN 256) at 1, 16, 300 tokens
    + [(t * 4, 32, 512, 512, ("bfloat16",), "contiguous") for t in (1, 16, 300)]
    + [(t * 4, 32, 512, 256, ("bfloat16",), "contiguous") for t in (1, 16, 300)])


# (rows, E, N, K, epilogue) of the fused calls, in a grouped suite entry's "epilogues" form
# (grouped_epilogue.suite_epilogue): the op's bias-and-scale test, the Experts tests' down
# projections (the row scale), the MoE block bench's down projections
FUSED_CALLS = (
    [(256, 8, 1024, 512, {"ROW_SCALE": True, "BIAS": True})]
    + [(t * 2, 8, 512, 1024, {"ROW_SCALE": True}) for t in (1, 16, 64, 300)]
    + [(t * 4, 32, 512, 256, {"ROW_SCALE": True}) for t in (1, 16, 300)]
    + [(t * 2, 8, 4096, 14336, {"ROW_SCALE": True}) for t in (1, 16, 4096)]
    + [(t * 8, 128, 2048, 768, {"ROW_SCALE": True}) for t in (1, 16, 4096)])
# (rows, E, 2I, K, epilogue) of the gate/up calls with SwiGLU fused ("halves": Experts'
# gate_up_proj) where the pick is a wide tile: the Experts tests' and the MoE block bench's
SWIGLU_CALLS = [(rows, E, n2, K, {"SWIGLU": "halves"}) for rows, E, n2, K in (
    [(t * 2, 8, 2048, 512) for t in (64, 300)] + [(4096 * 2, 8, 28672, 4096)]
    + [(4096 * 8, 128, 1536, 2048)])]


# (rows, E, N, K, out dtype, layout) of the fp8 tests' launches (contiguous: a has rows + 5
# rows, 5 unowned; masked: E x 40 rows)
FP8_TEST_CALLS = ([(r + 5, 8, 1024, 512, "bfloat16", "contiguous") for r in (7, 333, 2048, 300)]
                  + [(2048 + 5, 8, 1024, 512, "float16", "contiguous")]
                  + [(r + 5, 4, 200, 384, "bfloat16", "contiguous") for r in (9, 1000)]
                  + [(8 * 40, 8, 1024, 512, "bfloat16", "masked")])
# bench_grouped_fp8.py's defaults: these models' layers of the suite at these token counts
FP8_BENCH = {"models": ("Mixtral-8x7B", "Qwen3-30B-A3B"), "tokens": (16, 4096)}


def fp8_requests(suite, arch="sm_90a", sm_count=132):
    """[(step id, (M, N, K), kwargs)] of the fp8 tests and bench (each once)."""
    from tirx_gemm.op import grouped_fp8 as GF
    out = []
    for rows, E, N, K, odt, layout in FP8_TEST_CALLS:
        step, kw = GF.choose_grouped_fp8(rows, E, N, K, odt, sm_count, layout=layout)
        out.append((step, (NOMINAL_M, N, K), kw))
    for entry in json.loads(Path(suite).read_text())["shapes"]:
        if entry["model"] in FP8_BENCH["models"]:
            out += GF.fp8_builds(entry["E"], entry["N"], entry["K"], FP8_BENCH["tokens"],
                                 entry["top_k"], ("bfloat16",), sm_count)
    return out


def fused_test_cases():
    """tests/test_gpu_grouped.py's FUSED_CASES and TAIL_CASES as (N, K, keywords): the kernels
    it launches directly."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu_grouped", ROOT / "tests" /
                                                  "test_gpu_grouped.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "tests"))  # the test module imports its CPU twin
    spec.loader.exec_module(mod)
    E, N, K = mod.SHAPES[0]
    return ([(N, K, mod.fused_kernel_keywords(layout, tile)) for _, layout, tile in mod.FUSED_CASES]
            + [(n, k, mod.fused_kernel_keywords("contiguous", tile, shape=(e, n, k), rows=rows))
               for e, n, k, rows, _, tile in mod.TAIL_CASES])


def requests(suite=None, dtypes=None, tests=False, arch="sm_90a", sm_count=132, fp8=False,
             own_tokens=False):
    """[(Step, (M, N, K), kwargs)] for the export, each once, in order."""
    out, seen = [], set()

    def add(step_id, mnk, kw):
        key = (step_id, mnk, tuple(sorted(kw.items())))
        if key not in seen:
            seen.add(key)
            out.append((registry.get(step_id, arch), mnk, dict(kw)))

    if suite is not None:
        data = json.loads(Path(suite).read_text())
        for entry in data["shapes"]:
            entry = {k: v for k, v in entry.items()}
            entry["dtypes"] = list(dtypes or entry.get("dtypes") or data.get("dtypes"))
            entry.update(arch=arch, sm_count=sm_count)
            if own_tokens:
                entry["all_m"] = False
            for step_id, mnk, kw in G.suite_builds(entry):
                add(step_id, mnk, kw)
    if tests:
        for rows, E, N, K, dts, layout in TEST_CALLS:
            for dt in dts:
                if dtypes and dt not in dtypes:
                    continue
                step_id, kw = G.choose_grouped(rows, E, N, K, dt, layout, arch, sm_count)
                add(step_id, (NOMINAL_M, N, K), kw)
        for rows, E, N, K, epi in (*FUSED_CALLS, *SWIGLU_CALLS):
            if dtypes and "bfloat16" not in dtypes:
                continue
            # the kernel the op looks up for the call (None: the op runs it unfused)
            call = G.fused_call(rows, E, N, K, "bfloat16", "contiguous", arch, sm_count, epi)
            if call is not None:
                add(call[0], (NOMINAL_M, N, K), call[1])
        for N, K, kw in fused_test_cases():
            add("v14", (NOMINAL_M, N, K), kw)
    if fp8:
        default = ROOT / "lab" / "moe_grouped_gemm" / "suites" / "moe_experts.json"
        for step_id, mnk, kw in fp8_requests(suite or default, arch, sm_count):
            add(step_id, mnk, kw)
    return out


def variant_keywords(pick: dict, v: dict) -> dict:
    """A variant's kernel keywords (bench_grouped.py times what this builds): the pick's with
    the variant's on top; a variant naming a tile (BLK_M or BLK_N) replaces the pick's tile
    keywords, one without keeps the pick's tile."""
    drop = ("BLK_M", "BLK_N", "SWAP_AB", "GROUP") if ("BLK_M" in v or "BLK_N" in v) else ()
    return {**{k: x for k, x in pick.items() if k not in drop},
            **{k: x for k, x in v.items() if x is not False}}


def variant_requests(suite, variants, dtypes=("bfloat16",), arch="sm_90a", sm_count=132):
    """The kernels of a tile-variants file (bench_grouped.py --variants): at each of its cases,
    the pick's keywords with each variant's (variant_keywords)."""
    data, cases = json.loads(Path(suite).read_text()), json.loads(Path(variants).read_text())
    out = []
    for entry in data["shapes"]:
        for c in cases["cases"]:
            if c["model"] != entry["model"] or not entry["layer"].startswith(c["layer"]):
                continue
            for dt in dtypes:
                for t in c["tokens"]:
                    _, kw = G.choose_grouped(t * entry["top_k"], entry["E"], entry["N"],
                                             entry["K"], dt, "contiguous", arch, sm_count)
                    for v in c["variants"]:
                        out.append((registry.get("v14", arch), (NOMINAL_M, entry["N"], entry["K"]),
                                    variant_keywords(kw, v)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite")
    ap.add_argument("--dtypes", nargs="*")
    ap.add_argument("--tests", action="store_true")
    ap.add_argument("--out", default=str(ROOT / ".gpu" / "bundle"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--fp8", action="store_true",
                    help="the fp8 kernels (FP8_TEST_CALLS, FP8_BENCH)")
    ap.add_argument("--own-tokens", action="store_true",
                    help="each suite entry's own token counts only (all_m false)")
    ap.add_argument("--variants", help="a tile-variants file: its kernels too (needs --suite)")
    ap.add_argument("--ffi-wheel", metavar="PYVER", help="add the apache-tvm-ffi wheel for this "
                    "Python (e.g. 3.12) to the bundle")
    args = ap.parse_args(argv)
    reqs = requests(args.suite, args.dtypes, args.tests, fp8=args.fp8,
                    own_tokens=args.own_tokens)
    if args.variants:
        have = {(r[0].key, r[1], tuple(sorted(r[2].items()))) for r in reqs}
        for r in variant_requests(args.suite, args.variants, tuple(args.dtypes or ("bfloat16",))):
            if (r[0].key, r[1], tuple(sorted(r[2].items()))) not in have:
                have.add((r[0].key, r[1], tuple(sorted(r[2].items()))))
                reqs.append(r)
    for step, mnk, kw in reqs:
        print(step.key, "x".join(map(str, mnk)), kw, flush=True)
    print(f"{len(reqs)} kernels", flush=True)
    if args.list:
        return 0
    from tirx_gemm.compile.bundle import export
    export(reqs, Path(args.out), jobs=args.jobs,  # returns the kernel count, not an exit status
           ffi_wheel_python=args.ffi_wheel)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
