"""tirx_gemm/spec.py is the one home of the project's static facts: the package
reads them from there and writes none of them again; the copies that stay for teaching (a
builder's ``SM_COUNT: int = 148`` keyword default) are checked against it here."""
import inspect
import re
from pathlib import Path

import pytest

from tirx_gemm import registry, spec

PKG = Path(spec.__file__).resolve().parent

# what a copy of a fact looks like in source: the dtype pair, an SM count default or table
COPIES = {
    "the dtype set (spec.DTYPES)": re.compile(r"""\(\s*["']float16["']\s*,\s*["']bfloat16["']\s*\)"""),
    "an SM count (spec.SM_COUNT)": re.compile(
        r"""["']sm_(100a|90a)["']\s*:\s*1[34][28]\b|\b(int|sms?|sm_count|SM_COUNT)\s*[:=]\s*(int\s*=\s*)?1(32|48)\b"""),
    "the arch pair (spec.ARCHES)": re.compile(r"""\(\s*["']sm_100a["']\s*,\s*["']sm_90a["']\s*\)"""),
}


def _package_sources():
    for p in sorted(PKG.rglob("*.py")):
        if p.name == "spec.py" or "steps" in p.relative_to(PKG).parts:
            continue
        yield p


def test_the_package_copies_no_fact_of_spec():
    found = []
    for p in _package_sources():
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            for what, pat in COPIES.items():
                if pat.search(code):
                    found.append(f"{p.relative_to(PKG.parent)}:{n}: {what}: {line.strip()}")
    assert not found, "copies of spec.py's facts (import them from tirx_gemm.spec):\n" + \
        "\n".join(found)


def test_the_readers_hold_spec_itself():
    from tirx_gemm import helpers, numerics, splitk, timeline
    from tirx_gemm.report import records
    assert registry.ARCHES is spec.ARCHES
    assert numerics.DTYPES is spec.DTYPES and records.KNOWN_DTYPES is spec.DTYPES
    assert helpers.SUPPORTED_DTYPES is spec.DTYPES and helpers.AB_DTYPE == spec.DEFAULT_DTYPE
    assert splitk.DEFAULT_SM_COUNT is spec.SM_COUNT
    assert timeline.DEFAULT_SM_COUNT == spec.SM_COUNT["sm_90a"]


@pytest.mark.parametrize("step", [s for s in registry.STEPS if s.sm_count_kwarg],
                         ids=lambda s: s.key)
def test_each_persistent_builders_default_pool_is_specs_sm_count(step):
    """The builders keep ``SM_COUNT: int = 148`` in their signature (a lesson reads better
    with the number); this is the check that it never drifts from spec.SM_COUNT."""
    fn = step.builder()
    default = inspect.signature(fn).parameters[step.sm_count_kwarg].default
    assert default == spec.SM_COUNT[step.arch], (step.key, default)


def test_one_line_errors():
    with pytest.raises(ValueError, match="unknown dtype 'int4'"):
        spec.element_bytes("int4")
    with pytest.raises(ValueError, match="unknown arch 'sm_80'"):
        spec.sm_count("sm_80")
    assert spec.element_bytes("bfloat16") == 2 and spec.sm_count("sm_90a") == 132


def test_adding_a_dtype_is_spec_plus_one_entry_per_kernel_and_check_table():
    """Adding a 16-bit operand dtype: append it to spec.DTYPES and spec.ELEMENT_BYTES (the
    one room of facts), then give it one entry in each table below: the kernels' (the wgmma
    type name and the fp32 -> pair pack of sm_90a; sm_100a takes TVM's dtype as it is) and
    the checks' (tolerance bits, exact-input range, torch dtype, record label). Registry,
    builders' dtype checks, records, matmul and the CLI read spec.DTYPES and need nothing.
    A dtype in spec.DTYPES that a table lacks fails here, naming the table."""
    pytest.importorskip("tvm")
    pytest.importorskip("torch")
    from tirx_gemm import hopper, numerics
    from tirx_gemm.report import records
    from tirx_gemm.run import launcher
    rooms = {
        "spec.ELEMENT_BYTES": spec.ELEMENT_BYTES,
        "hopper._WGMMA_TYPE (kernels, sm_90a)": hopper._WGMMA_TYPE,
        "hopper._PACK_FN (kernels, sm_90a epilogue)": hopper._PACK_FN,
        "numerics.SIGNIFICANT_BITS (tolerances)": numerics.SIGNIFICANT_BITS,
        "numerics.INT_RANGE (exact inputs)": numerics.INT_RANGE,
        "run.launcher._TORCH_DTYPES (GPU runs)": launcher._TORCH_DTYPES,
        "report.records.DTYPE_LABEL (tables)": records.DTYPE_LABEL,
    }
    lacking = {room: sorted(set(spec.DTYPES) - set(table)) for room, table in rooms.items()
               if set(spec.DTYPES) - set(table)}
    assert not lacking, f"dtypes of spec.DTYPES without an entry: {lacking}"
