"""Shape suites: the GEMMs real models run, checked and timed against torch in one command.

A suite is a JSON file (the packaged one: ``tirx_gemm/op/suites/models.json``)::

    {"name": "models", "description": "...", "dtypes": ["float16", "bfloat16"],
     "shapes": [{"M": 128, "N": 6144, "K": 4096, "model": "Llama-3-8B",
                 "layer": "attention QKV projection", "why": "24 output tiles for 66 ..."},
                ...]}

Shapes follow the steps' product D = A @ B.T (A MxK tokens x in-features, B NxK a Linear
weight): a Linear in->out over T tokens is M=T, N=out, K=in. Each entry names its source
(``model``, ``layer``) and why it is in the suite, and runs in every dtype of the suite
(an entry's own ``dtypes`` overrides them). An entry may list the fused epilogues its layer
uses, ``"epilogues": [{"BIAS": "bfloat16", "ACT": "gelu"}, {"SWIGLU": true}, ...]`` (builder
keywords, tirx_gemm.epilogue; with SWIGLU, N is the output's columns: the intermediate
size): :func:`export_requests` then adds, for target "matmul", the kernels
matmul.variants picks for each, so one bundle serves the model's fused calls too, and v12's
plain kernel of the same tile as each entry's fused one (``matmul(..., step="v12")`` picks
it: the baseline that isolates an epilogue's cost) and, for SwiGLU, matmul's plain kernel of
the GEMM over the fused weight (M x 2N x K). ``"all_m": false`` on an entry keeps
its kernels to its own M (a lab suite of exact shapes; the default true adds every token
count of its N, K); ``"layouts": ["NT", "TN", "TT"]`` adds v15's kernels for those
transposed views (sm_90a). The benchmark (:func:`plan`) runs the plain GEMM of each entry.
A top-level ``"epilogue_steps": ["v10"]`` (steps of matmul.EPILOGUE_STEPS) adds, for each
entry's epilogue that step builds, its fused kernel and its plain kernel
(``matmul(..., step="v10")`` with and without the epilogue; a lab comparison of steps).

:func:`load_suite` validates a file, :func:`plan` turns it into (step, shape, kwargs, dtype)
for a step id or for ``"matmul"`` (the step :func:`tirx_gemm.matmul.choose` picks),
:func:`export_requests` gives the builds a bundle for it needs, and :func:`bench_suite`
checks and times each case and torch.matmul in the same run (runner.run_step), records
it and prints the table with the geomean and minimum ratio to torch. Imports neither torch
nor TVM at import time: planning and export requests work on a build machine without torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Callable, NamedTuple

from tirx_gemm import registry, spec
from tirx_gemm.report import tables
from tirx_gemm.op import cards as _cards, layouts as _layouts
from tirx_gemm.op.matmul import (NOMINAL_M, ROW_MULTIPLE, build_shape, choose,
                                 choose_epilogue_on, step_kwargs, variants)
from tirx_gemm.numerics import DTYPES

__all__ = ["DEFAULT_SUITE", "MATMUL", "Entry", "Suite", "Item", "load_suite", "plan",
           "export_requests", "summarize", "format_table", "bench_suite"]

DEFAULT_SUITE = Path(__file__).resolve().parent / "suites" / "models.json"
MATMUL = "matmul"  # the target that runs what tirx_gemm.matmul would run
RECORDS_SUBDIR = "suites"  # suite records: results/suites/<device>.jsonl, out of the README table

_TOP_KEYS = {"name", "description", "dtypes", "shapes", "epilogue_steps", "kind", "scales"}
_ENTRY_KEYS = {"M", "N", "K", "model", "layer", "why", "dtypes", "epilogues", "all_m", "kind",
               "scales", "layouts"}
_TEXT_KEYS = ("model", "layer", "why")
GEMM, FP8, GROUPED = "gemm", "fp8", "grouped"
KINDS = (GEMM, FP8, GROUPED)
FP8_SCALES = ("tensor", "row", "block")  # numerics.FP8_SCALES: matmul_fp8's scale kinds


@dataclasses.dataclass(frozen=True)
class Entry:
    M: int
    N: int
    K: int
    model: str
    layer: str
    why: str
    dtypes: tuple[str, ...]
    epilogues: tuple = ()  # ((keyword, value), ...) per epilogue, validated (tirx_gemm.epilogue)
    all_m: bool = True     # export: every token count of (N, K), not only M
    kind: str = GEMM       # "gemm" (matmul), "fp8" (matmul_fp8) or "grouped" (op.grouped)
    scales: tuple[str, ...] = ()  # fp8: the scale kinds it runs in (tensor, row, block)
    raw: str = ""          # grouped: the entry as written (JSON), for grouped.suite_builds
    layouts: tuple[str, ...] = ()  # gemm: transposed layouts (op.layouts), v15's kernels too

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.M, self.N, self.K)

    @property
    def label(self) -> str:
        return f"{self.M}x{self.N}x{self.K}"


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    description: str
    entries: tuple[Entry, ...]
    path: Path | None = None
    epilogue_steps: tuple[str, ...] = ()  # export: these steps' epilogue kernels too

    def cases(self) -> list[tuple[Entry, str]]:
        """(entry, dtype) of the plain GEMM entries in file order, each entry's dtypes in
        order: what a matmul run covers (fp8 and grouped entries: fp8_cases, grouped)."""
        return [(e, dt) for e in self.entries if e.kind == GEMM for dt in e.dtypes]

    def fp8_cases(self) -> list[tuple[Entry, str, str]]:
        """(entry, out dtype, scale kind) of the fp8 entries, in file order."""
        return [(e, dt, sc) for e in self.entries if e.kind == FP8 for dt in e.dtypes
                for sc in e.scales]

    def grouped(self) -> list[Entry]:
        """The grouped entries (tirx_gemm.op.grouped builds and runs them)."""
        return [e for e in self.entries if e.kind == GROUPED]


class Item(NamedTuple):
    step: registry.Step
    shape: tuple[int, int, int]
    kwargs: dict
    dtype: str


def _dtypes(value, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: dtypes must be a non-empty list of {', '.join(DTYPES)}")
    bad = [d for d in value if d not in DTYPES]
    if bad:
        raise ValueError(f"{where}: dtype {bad[0]!r} is not one of {', '.join(DTYPES)}")
    if len(set(value)) != len(value):
        raise ValueError(f"{where}: dtypes lists one twice: {value}")
    return tuple(value)


def _kind(value, at: str) -> str:
    if value not in KINDS:
        raise ValueError(f"{at}: kind={value!r} must be one of {', '.join(KINDS)}")
    return value


def _scales(value, at: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or any(v not in FP8_SCALES for v in value) \
            or len(set(value)) != len(value):
        raise ValueError(f"{at}: scales must be a non-empty list of distinct scale kinds "
                         f"among {', '.join(FP8_SCALES)} (got {value!r})")
    return tuple(value)


def _grouped_entry(raw: dict, at: str, dtypes: tuple[str, ...]) -> Entry:
    """A grouped entry: its source text checked here, the rest of its keys passed as written
    to tirx_gemm.op.grouped.suite_builds (GO's hook, imported only when exporting)."""
    for k in _TEXT_KEYS:
        if not isinstance(raw.get(k), str) or not raw[k].strip():
            raise ValueError(f"{at}: {k!r} must be a non-empty string (each entry names its "
                             "source model and layer and why it is in the suite)")
    dims = [raw.get(k) for k in ("M", "N", "K")]
    M, N, K = (d if isinstance(d, int) and not isinstance(d, bool) else 0 for d in dims)
    own = _dtypes(raw["dtypes"], at) if "dtypes" in raw else dtypes
    raw = {**raw, "kind": GROUPED, "dtypes": list(own)}  # the suite's defaults made explicit
    return Entry(M, N, K, raw["model"].strip(), raw["layer"].strip(), raw["why"].strip(), own,
                 kind=GROUPED, raw=json.dumps(raw, sort_keys=True))


def _entry(raw, i: int, where: str, dtypes: tuple[str, ...], kind: str = GEMM,
           scales: tuple[str, ...] = FP8_SCALES) -> Entry:
    at = f"{where}: entry {i}"
    if not isinstance(raw, dict):
        raise ValueError(f"{at} must be a JSON object, got {type(raw).__name__}")
    dims = {k: raw.get(k) for k in ("M", "N", "K")}
    if all(isinstance(v, int) for v in dims.values()):
        at += f" ({dims['M']}x{dims['N']}x{dims['K']})"
    kind = _kind(raw.get("kind", kind), at)
    if kind == GROUPED:
        return _grouped_entry(raw, at, dtypes)
    unknown = sorted(set(raw) - _ENTRY_KEYS)
    if unknown:
        raise ValueError(f"{at}: unknown key {unknown[0]!r} (an entry has "
                         f"{', '.join(sorted(_ENTRY_KEYS))})")
    for k, v in dims.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{at}: {k}={v!r} must be a positive integer")
    for k in ("N", "K"):
        if dims[k] % ROW_MULTIPLE:
            raise ValueError(f"{at}: {k}={dims[k]} is not a multiple of {ROW_MULTIPLE} (TMA "
                             "needs 16-byte row strides), no step takes it")
    for k in _TEXT_KEYS:
        if not isinstance(raw.get(k), str) or not raw[k].strip():
            raise ValueError(f"{at}: {k!r} must be a non-empty string (each entry names its "
                             "source model and layer and why it is in the suite)")
    own = _dtypes(raw["dtypes"], at) if "dtypes" in raw else dtypes
    all_m = raw.get("all_m", True)
    if not isinstance(all_m, bool):
        raise ValueError(f"{at}: all_m={all_m!r} must be true or false")
    epilogues = _epilogues(raw.get("epilogues", []), at)
    _check_limits(dims["M"], dims["N"], dims["K"], epilogues, at)
    if kind == GEMM:
        if "scales" in raw:
            raise ValueError(f"{at}: scales are for fp8 entries (\"kind\": \"fp8\")")
        lays = _layouts.suite_layouts(raw["layouts"], at) if "layouts" in raw else ()
        return Entry(dims["M"], dims["N"], dims["K"], raw["model"].strip(),
                     raw["layer"].strip(), raw["why"].strip(), own, epilogues, all_m,
                     layouts=lays)
    if "layouts" in raw:
        raise ValueError(f"{at}: layouts are for gemm entries")
    if epilogues:
        raise ValueError(f"{at}: an fp8 entry has no epilogues (matmul_fp8 fuses none)")
    own_scales = _scales(raw["scales"], at) if "scales" in raw else scales
    _check_fp8_entry(dims["N"], dims["K"], own_scales, at)
    return Entry(dims["M"], dims["N"], dims["K"], raw["model"].strip(), raw["layer"].strip(),
                 raw["why"].strip(), own, (), all_m, FP8, own_scales)


def _check_fp8_entry(N: int, K: int, scales, at: str) -> None:
    """What matmul_fp8 refuses of a shape, refused here before any build: K a multiple of
    16 (16-byte rows of e4m3), of 128 with block scales (op.fp8.check_block_k)."""
    from tirx_gemm.op import fp8
    if K % fp8.K_MULTIPLE:
        raise ValueError(f"{at}: K={K} is not a multiple of {fp8.K_MULTIPLE} (16-byte rows of "
                         f"e4m3): matmul_fp8 cannot take it")
    if "block" in scales and K % fp8.SCALE_BLOCK:
        raise ValueError(f"{at}: K={K} with block scales: {fp8.block_k_rule()}")


def _check_limits(M: int, N: int, K: int, epilogues: tuple, at: str) -> None:
    """The limits ``build --mnk``, ``choose`` and the builds themselves hold a shape to
    (compile.api.check_shape_limits: the int32 index math), on the build machine, before
    any kernel of the suite is built; a SwiGLU entry's GEMM over the fused weight is
    M x 2N x K."""
    from tirx_gemm.compile.api import check_shape_limits
    swiglu = any(dict(e).get("SWIGLU") for e in epilogues)
    try:
        check_shape_limits(M, N, K)
        if swiglu:
            check_shape_limits(M, 2 * N, K)
    except ValueError as exc:
        raise ValueError(f"{at}: {exc}" + (" (with SWIGLU, the GEMM over the fused weight "
                                           "is M x 2N x K)" if swiglu else "")) from None


def _epilogues(value, at: str) -> tuple:
    from tirx_gemm import epilogue as E
    if not isinstance(value, list):
        raise ValueError(f"{at}: epilogues must be a list of objects of builder keywords "
                         f"({', '.join(E.KEYWORDS)})")
    out = []
    for j, epi in enumerate(value):
        if not isinstance(epi, dict) or not epi:
            raise ValueError(f"{at}: epilogues[{j}] must be a non-empty object of builder "
                             f"keywords ({', '.join(E.KEYWORDS)})")
        unknown = sorted(set(epi) - set(E.KEYWORDS))
        if unknown:
            raise ValueError(f"{at}: epilogues[{j}] has unknown key {unknown[0]!r} (one of "
                             f"{', '.join(E.KEYWORDS)})")
        try:
            kw = E.epilogue_kwargs(epi)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{at}: epilogues[{j}]: {exc}") from None
        if not kw:
            raise ValueError(f"{at}: epilogues[{j}] is the plain GEMM: leave it out")
        key = tuple(sorted(kw.items()))
        if key in out:
            raise ValueError(f"{at}: epilogues[{j}] repeats an earlier one")
        out.append(key)
    return tuple(out)


def load_suite(path=None) -> Suite:
    """The suite in ``path`` (default: the packaged models.json), validated: every problem
    is a one-line ValueError naming the file and the entry."""
    path = Path(path) if path is not None else DEFAULT_SUITE
    where = str(path)
    if path.exists() and not (path.is_file() or path.is_dir()):  # a dir: read_text says so
        raise ValueError(f"suite {where}: not a regular file (a pipe or device is read "
                         f"until it closes): pass a .json file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"suite {where}: cannot read it ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"suite {where}: not valid JSON ({exc})") from None
    except RecursionError:
        raise ValueError(f"suite {where}: nests too deeply to be a suite") from None
    if not isinstance(data, dict):
        raise ValueError(f"suite {where}: the top level must be a JSON object")
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ValueError(f"suite {where}: unknown key {unknown[0]!r} (a suite has "
                         f"{', '.join(sorted(_TOP_KEYS))})")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"suite {where}: 'name' must be a non-empty string")
    shapes = data.get("shapes")
    if not isinstance(shapes, list) or not shapes:
        raise ValueError(f"suite {where}: 'shapes' must be a non-empty list of entries")
    dtypes = _dtypes(data["dtypes"], f"suite {where}") if "dtypes" in data else DTYPES
    kind = _kind(data.get("kind", GEMM), f"suite {where}")
    scales = _scales(data["scales"], f"suite {where}") if "scales" in data else FP8_SCALES
    entries, seen = [], {}
    for i, raw in enumerate(shapes):
        e = _entry(raw, i, f"suite {where}", dtypes, kind, scales)
        key = (e.kind, e.raw or e.shape)
        if key in seen:
            raise ValueError(f"suite {where}: entry {i} ({e.label}) repeats entry "
                             f"{seen[key]}: list each shape once")
        seen[key] = i
        entries.append(e)
    return Suite(name.strip(), str(data.get("description", "")), tuple(entries), path,
                 _epilogue_steps(data.get("epilogue_steps", []), f"suite {where}"))


def _epilogue_steps(value, where: str) -> tuple[str, ...]:
    from tirx_gemm.op.matmul import EPILOGUE_STEPS
    known = sorted(set().union(*EPILOGUE_STEPS.values()))
    if not isinstance(value, list) or any(v not in known for v in value) \
            or len(set(value)) != len(value):
        raise ValueError(f"{where}: 'epilogue_steps' must be a list of distinct step ids "
                         f"among {', '.join(known)} (got {value!r})")
    return tuple(value)


def _as_suite(suite) -> Suite:
    return suite if isinstance(suite, Suite) else load_suite(suite)


def target_step(target: str, arch: str) -> registry.Step:
    """The step ``target`` names, or a one-line ValueError echoing it as typed."""
    try:
        return registry.get(str(target), arch)
    except ValueError:
        ids = ", ".join(s.id for s in registry.all_steps(arch))
        raise ValueError(f"--target {target!r} is neither {MATMUL!r} nor a step of {arch} "
                         f"({ids})") from None


def plan(suite, target: str, arch: str, sm_count: int, bundle=None) -> list[Item]:
    """One Item (step, shape, kwargs, dtype) per case of ``suite`` (Suite.cases() order) on
    a GPU of ``arch`` with ``sm_count`` SMs. ``target`` "matmul": the step and keywords
    tirx_gemm.matmul would run with kernels from ``bundle`` (matmul.choose on the card
    cards.pick assumes: the GPU present where the bundle was exported for it); a step id
    ("v9"): that step, with the dtype and the SM count (matmul.step_kwargs)."""
    suite = _as_suite(suite)
    if arch not in registry.ARCHES:
        raise ValueError(f"unknown arch {arch!r}: choose one of {', '.join(registry.ARCHES)}")
    if isinstance(sm_count, bool) or not isinstance(sm_count, int) or sm_count < 1:
        raise ValueError(f"sm_count={sm_count!r} must be a positive int (the SMs of the GPU "
                         "that will run the suite: 132 on an H200)")
    fixed = None if target == MATMUL else target_step(target, arch)
    items = []
    for e, dtype in suite.cases():
        if fixed is None:
            step_id, kw = (choose(e.M, e.N, e.K, dtype, arch, sm_count) if bundle is None else
                           _cards.pick(choose, e.M, e.N, e.K, dtype, arch, sm_count, bundle=bundle))
            step = registry.get(step_id, arch)
        else:
            step, kw = fixed, step_kwargs(fixed, dtype, sm_count)
        items.append(Item(step, e.shape, kw, dtype))
    return items


def export_requests(suite, target: str, arch: str, sm_count: int) -> list[tuple]:
    """The builds a bundle for ``suite`` needs, as build_many / bundle.export requests
    (step, (M, N, K), kwargs), each once, in plan order. A runtime-M kernel is requested
    at matmul.build_shape (one build serves every M); for target "matmul", where a suite
    shape's kernel takes M at run time, every runtime-M kernel matmul.variants picks for
    its (N, K, dtype) over all M is added too, so the bundle serves every token count of
    the suite's layers (on sm_100a v11 keeps compile-time M: only the suite's M)."""
    out, seen = [], set()

    def add(step, mnk, kwargs):
        shape = build_shape(mnk, kwargs)
        key = (step.key, shape, tuple(sorted(kwargs.items())))
        if key not in seen:
            seen.add(key)
            out.append((step, shape, dict(kwargs)))

    layers = []
    suite = _as_suite(suite)
    for it, (e, _) in zip(plan(suite, target, arch, sm_count), suite.cases()):
        add(it.step, it.shape, it.kwargs)
        if target == MATMUL and it.kwargs.get("RUNTIME_M") and e.all_m:
            layers.append((it.shape[1], it.shape[2], it.dtype, ()))
    if target == MATMUL:  # the fused epilogues the entries list (matmul's v12 kernels)
        from tirx_gemm import epilogue as E
        for e, dtype in suite.cases():
            for epi in e.epilogues:
                step_id, kwargs = choose(e.M, e.N, e.K, dtype, arch, sm_count, dict(epi))
                step = registry.get(step_id, arch)
                add(step, e.shape, kwargs)
                # v12's plain kernel of the same tile: matmul(..., step="v12") at the GEMM
                plain = {k: v for k, v in kwargs.items() if k not in E.WITH_EPILOGUE}
                kn = E.kernel_n(e.N, dict(epi))
                add(step, (e.M, kn, e.K), plain)
                if kn != e.N:  # SwiGLU: matmul's plain GEMM over the fused weight too
                    p_id, p_kw = choose(e.M, kn, e.K, dtype, arch, sm_count)
                    add(registry.get(p_id, arch), (e.M, kn, e.K), p_kw)
                if kwargs.get("RUNTIME_M") and e.all_m:
                    layers.append((e.N, e.K, dtype, epi))
                for other in suite.epilogue_steps:  # a lab comparison: its fused + plain
                    if not _builds_epilogue(other, dict(epi)):
                        continue
                    o_id, o_kw = choose_epilogue_on(other, e.M, e.N, e.K, dtype, arch,
                                                    sm_count, dict(epi))
                    o_step = registry.get(o_id, arch)
                    add(o_step, e.shape, o_kw)
                    add(o_step, (e.M, kn, e.K),
                        {k: v for k, v in o_kw.items() if k not in E.WITH_EPILOGUE})
    for N, K, dtype, epi in dict.fromkeys(layers):
        for step_id, kwargs, _, _ in variants(N, K, dtype, arch, sm_count,
                                              epilogue=dict(epi) or None):
            # a compile-time-M variant (sm_100a's v11) would serve only NOMINAL_M: the
            # suite's own shapes (added above) are all such a bundle can hold of it
            if kwargs.get("RUNTIME_M"):
                add(registry.get(step_id, arch), (NOMINAL_M, N, K), kwargs)
    if target == MATMUL:  # transposed layouts: v15 reads them in place (tirx_gemm.op.layouts)
        for e, dtype in suite.cases():
            for step, shape, kwargs in _layouts.suite_requests(e.M, e.N, e.K, dtype, e.layouts,
                                                               arch, sm_count):
                add(step, shape, kwargs)
    if suite.fp8_cases():  # matmul_fp8's kernels (run-time shapes: a few serve the suite)
        from tirx_gemm.op import fp8
        for step, shape, kwargs in fp8.suite_requests(suite.fp8_cases(), arch, sm_count):
            add(step, shape, kwargs)
    for e in suite.grouped():  # op.grouped's hook says what a grouped entry needs
        for step, shape, kwargs in grouped_requests(e, arch, sm_count):
            key = (step.key, shape, tuple(sorted(kwargs.items())))
            if key not in seen:
                seen.add(key)
                out.append((step, shape, dict(kwargs)))
    return out


def grouped_requests(entry: Entry, arch: str, sm_count: int) -> list[tuple]:
    """(step, shape, keywords) of a grouped entry, from tirx_gemm.op.grouped.suite_builds
    (imported here, lazily: a suite without grouped entries never needs it); the export's
    arch and SM count unless the entry names its own."""
    try:
        from tirx_gemm.op import grouped
    except ImportError as exc:
        raise ValueError(f"entry {entry.model} {entry.layer}: grouped entries need "
                         f"tirx_gemm.op.grouped ({exc})") from None
    raw = {"arch": arch, "sm_count": sm_count, **json.loads(entry.raw)}
    reqs = []
    for step_id, mnk, kwargs in grouped.suite_builds(raw):
        reqs.append((registry.get(step_id, arch), tuple(mnk), dict(kwargs)))
    return reqs


def _builds_epilogue(step_id: str, epi: dict) -> bool:
    """Whether ``step_id`` builds the epilogue ``epi`` (v10: BIAS and ACT only)."""
    from tirx_gemm.op import rules
    if step_id == rules.PINGPONG:
        return set(epi) <= set(rules.V10_KEYWORDS)
    return True


# --------------------------------------------------------------------------------------
# the benchmark
# --------------------------------------------------------------------------------------
HEAD = ("M x N x K", "dtype", "step", "kwargs", "check", "TFLOP/s", "torch TFLOP/s", "ratio")


def _kw_text(kwargs: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(kwargs.items()) if k != "dtype") or "-"


def summarize(records) -> dict:
    """Geomean and minimum of ratio_to_torch over the verified, timed records: {"n",
    "geomean_ratio", "min_ratio", "min_case"} (None when nothing was timed)."""
    ratios = [(r["ratio_to_torch"], r) for r in records
              if r.get("verified") and isinstance(r.get("ratio_to_torch"), (int, float))
              and r["ratio_to_torch"] > 0]
    if not ratios:
        return {"n": 0, "geomean_ratio": None, "min_ratio": None, "min_case": None}
    worst, rec = min(ratios, key=lambda x: x[0])
    dt = _case_dtype(rec) if rec.get("suite") else ""
    return {"n": len(ratios),
            "geomean_ratio": math.exp(sum(math.log(x) for x, _ in ratios) / len(ratios)),
            "min_ratio": worst,
            "min_case": f"{rec['M']}x{rec['N']}x{rec['K']} {dt}".strip()}


def _case_dtype(r) -> str:
    """The table's dtype column: the out dtype, and for fp8 records e4m3 and the scale kind."""
    s = r.get("suite") or {}
    return s.get("dtype", "?") + (f" e4m3 {s['scale']}" if s.get("scale") else "")


def format_table(records, failed=(), skipped=()) -> str:
    """The suite's text table (one row per record, then one per case that could not run or
    was skipped, as (case, why)) and the summary line."""
    f = tables.fmt
    rows = [[f"{r['M']}x{r['N']}x{r['K']}", _case_dtype(r), r["step"],
             _kw_text(r.get("build_kwargs") or {}),
             "ok" if r.get("verified") else "FAIL", f(r.get("tflops"), ".1f"),
             f(r.get("torch_tflops"), ".1f"), f(r.get("ratio_to_torch"), ".3f")]
            for r in records]
    rows += [[f"{it.shape[0]}x{it.shape[1]}x{it.shape[2]}", it.dtype, it.step.id,
              _kw_text(it.kwargs), f"NOT RUN: {why}"] if isinstance(it, Item)
             else [str(it), "", "", "", f"NOT RUN: {why}"] for it, why in failed]
    rows += [[str(it), "", "", "", f"SKIPPED: {why}"] for it, why in skipped]
    s = summarize(records)
    line = (f"geomean ratio to torch {s['geomean_ratio']:.3f}, min {s['min_ratio']:.3f} "
            f"({s['min_case']}), over {s['n']} checked and timed case(s)"
            if s["n"] else "no case was checked and timed: no ratio to torch")
    line += f"; {len(failed)} case(s) not run" if failed else ""
    line += f"; {len(skipped)} case(s) skipped" if skipped else ""
    for scale in FP8_SCALES:  # fp8: each scale kind against torch's same kind
        part = [r for r in records if (r.get("suite") or {}).get("scale") == scale]
        f8 = summarize(part)
        if f8["n"]:
            line += (f"\nfp8 {scale}: geomean x torch._scaled_mm {f8['geomean_ratio']:.3f}, "
                     f"min {f8['min_ratio']:.3f} ({f8['min_case']}) over {f8['n']} case(s)")
        big = [r["ratio_to_torch_tensor"] for r in part if r.get("verified") and r["M"] >= 2048
               and r.get("ratio_to_torch_tensor")]
        if big:
            g = math.exp(sum(map(math.log, big)) / len(big))
            line += f"; x torch per tensor at M >= 2048: geomean {g:.3f} over {len(big)}"
    return tables.text(HEAD, rows, "<<<<<>>>") + "\n" + line


def bench_suite(path=None, target: str = MATMUL, *, bundle=None,
                log: Callable[[str], None] = print, results_dir="results",
                record: bool = True) -> dict:
    """Check and time every case of the suite at ``path`` (default: the packaged one) on
    this GPU, running ``target`` ("matmul" or a step id), each against torch.matmul(A, B.T)
    timed in the same run (runner.run_step: fresh inputs, D poisoned with NaN, exact and
    random checks, warm-up, CUDA events, inputs rotated past L2, launches alternating).

    Kernels come from ``bundle`` when given, else are built here for this GPU's SM count.
    A case whose kernel cannot be had (a step that refuses the shape, a bundle without it)
    is reported and skipped; a kernel that fails on the GPU stops the run. With ``record``
    each record, with a "suite" field (name, file, target, model, layer, dtype), is
    appended to ``results_dir``/suites/<device>.jsonl. Logs the table and the geomean and
    minimum ratio to torch; returns {"records", "failed": [(Item, reason)], "skipped":
    [(grouped entry, the lab script that times it)], "summary", "table"}.
    """
    from tirx_gemm.run import device, loader, runner
    from tirx_gemm.report import records as rec_io
    from tirx_gemm.compile.api import BuildError
    from tirx_gemm.op.matmul import kernel_source
    suite = _as_suite(path)
    arch, why = device.gpu_arch()
    if arch is None:
        raise device.DeviceMismatchError(f"cannot run suite {suite.name}: {why}")
    info = device.check_device(arch, query_smi=False)
    items = plan(suite, target, arch, info["sm_count"], bundle)
    recs, failed, paths = [], [], set()
    for i, ((entry, dtype), it) in enumerate(zip(suite.cases(), items), 1):
        log(f"[{i}/{len(items)}] {entry.label} {dtype} {it.step.key} {_kw_text(it.kwargs)} "
            f"({entry.model}, {entry.layer})")
        try:
            lib, meta = kernel_source(it.step, it.shape, it.kwargs, bundle)
        except (ValueError, BuildError, RuntimeError) as exc:
            reason = (str(exc).strip() or type(exc).__name__).splitlines()[0]
            log(f"    not run: {reason}")
            failed.append((it, reason))
            continue
        kernel = loader.load_kernel(str(lib))  # run_step passes the step's workspace
        rec = runner.run_step(kernel, meta, check=True, time=True,
                              git_sha=meta.get("git_sha"), log=lambda m: log("    " + m))
        rec["suite"] = {"name": suite.name, **suite_file_fields(suite.path), "target": target,
                        "model": entry.model, "layer": entry.layer, "dtype": dtype}
        recs.append(rec)
        if record:
            paths.add(str(rec_io.append_record(rec, Path(results_dir) / RECORDS_SUBDIR)))
    if suite.fp8_cases():  # matmul_fp8 against torch._scaled_mm, same scale kind
        from tirx_gemm.op import fp8_bench
        from tirx_gemm.op.matmul import use_bundle
        if bundle is not None:
            use_bundle(bundle)
        f_recs, f_failed = fp8_bench.bench_cases(suite, device_name=info["name"],
                                                 sm_count=info["sm_count"], log=log,
                                                 file_fields=suite_file_fields(suite.path))
        for rec in f_recs:
            recs.append(rec)
            if record:
                paths.add(str(rec_io.append_record(rec, Path(results_dir) / RECORDS_SUBDIR)))
        failed += f_failed
    note = (f"not timed here: run lab/moe_grouped_gemm/bench_grouped.py --suite "
            f"{suite.path or 'FILE'} --out OUT.jsonl (the expert GEMMs) or "
            f"lab/moe_grouped_gemm/bench_moe_mlp.py --out OUT.jsonl (a whole MoE block)")
    skipped = [(f"grouped {e.model} {e.layer}", note) for e in suite.grouped()]
    table = format_table(recs, failed, skipped)
    log("\n" + table)
    log(f"device: {info['name']} ({arch}, {info['sm_count']} SMs); suite {suite.name}, "
        f"target {target}")
    if paths:
        log(f"records appended to {', '.join(sorted(paths))}")
    return {"records": recs, "failed": failed, "skipped": skipped, "summary": summarize(recs),
            "table": table}


# --------------------------------------------------------------------------------------
# the README's suite summary: generated from results/suites/*.jsonl, never typed
# --------------------------------------------------------------------------------------
SUMMARY_BEGIN, SUMMARY_END = "<!-- suite:begin -->", "<!-- suite:end -->"


def latest_runs(records) -> dict:
    """{(device, target): {(M, N, K, dtype): record}}: each case's latest record per
    device and target (records appended later win)."""
    out: dict = {}
    for r in records:
        s = r.get("suite") or {}
        key = (r.get("device", "?"), s.get("target", "?") + (f" {s['scale']}" if s.get("scale")
                                                             else ""))
        out.setdefault(key, {})[(r["M"], r["N"], r["K"], s.get("dtype", r.get("dtype")))] = r
    return out


def suite_file_fields(path) -> dict:
    """How a record names its suite file: relative to the checkout when it lies in it
    (never this machine's absolute path), else by its file name; and its sha256, which
    names the content wherever it lies."""
    import hashlib
    path = Path(path).resolve()
    try:
        name = path.relative_to(Path(__file__).resolve().parents[2]).as_posix()
    except ValueError:
        name = path.name
    return {"file": name, "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def render_summary(results_dir="results") -> str:
    """Markdown: per device and target, the geomean and minimum ratio to torch.matmul over
    the suite's latest records (fp16, bf16 and both), and the five slowest cases. Records
    are validated as they load (report.records.load_records: "verified" a real bool, ...);
    a damaged line is a one-line ValueError naming it."""
    from tirx_gemm.report import records as rec_io
    recs = rec_io.load_records(Path(results_dir) / RECORDS_SUBDIR)
    if not recs:
        return "No suite records yet: `tirx-gemm bench --suite --record` on a GPU host makes them."
    lines = ["| device | target | cases | geomean × torch (fp16 / bf16 / all) | min × torch |",
             "|---|---|---|---|---|"]
    worst_lines = []
    for (device, target), cases in sorted(latest_runs(recs).items()):
        rows = list(cases.values())
        by = {dt: summarize([r for r in rows if (r.get("suite") or {}).get("dtype") == dt])
              for dt in spec.DTYPES}
        alls = summarize(rows)
        g = " / ".join(f"{x['geomean_ratio']:.3f}" if x["n"] else "—"
                       for x in (by["float16"], by["bfloat16"], alls))
        mn = f"{alls['min_ratio']:.3f} ({alls['min_case']})" if alls["n"] else "—"
        when = max(str(r.get("timestamp") or r.get("when") or "") for r in rows)[:10]
        lines.append(f"| {device} | {target} | {alls['n']}/{len(rows)} checked and timed"
                     f"{', ' + when if when else ''} | {g} | {mn} |")
        timed = sorted((r for r in rows if r.get("ratio_to_torch")),
                       key=lambda r: r["ratio_to_torch"])[:5]
        worst_lines.append(f"- {device}, {target}, slowest: " + "; ".join(
            f"{r['M']}x{r['N']}x{r['K']} {(r.get('suite') or {}).get('dtype', '')} "
            f"{r['step']} {r['ratio_to_torch']:.2f}×" for r in timed))
    return "\n".join(lines + [""] + worst_lines)
