"""The registry is the single table of steps: check it is complete and consistent."""
import inspect

import pytest

from tirx_gemm import registry


def test_keys_unique_and_steps_in_order():
    # in increasing order on each track, and both tracks have the same steps; a number may
    # be skipped (v11, split-K, came before v10)
    keys = [s.key for s in registry.STEPS]
    assert len(keys) == len(set(keys))
    tracks = {arch: [s.id for s in registry.all_steps(arch)] for arch in registry.ARCHES}
    for arch, ids in tracks.items():
        nums = [int(i[1:]) for i in ids]
        assert nums == sorted(set(nums)) and nums[:9] == list(range(1, 10)), (arch, ids)
    # a step on one track only says why (registry.Step.one_track); the others are twins
    for s in registry.STEPS:
        if s.one_track is not None:
            assert len(s.one_track) > 30, s.key
    twins = {arch: [s.id for s in registry.all_steps(arch) if s.one_track is None]
             for arch in registry.ARCHES}
    assert len({tuple(ids) for ids in twins.values()}) == 1, twins


def test_both_tracks_have_the_tutorials_seven_steps_at_least():
    for arch in registry.ARCHES:
        ids = [s.id for s in registry.all_steps(arch)]
        assert ids[:7] == [f"v{i}" for i in range(1, 8)], (arch, ids)


@pytest.mark.parametrize("step", registry.STEPS, ids=lambda s: s.key)
def test_builder_importable_with_documented_signature(step):
    fn = step.builder()
    assert fn.__name__ == f"hgemm_{step.id}"
    params = list(inspect.signature(fn).parameters)
    assert params[:3] == ["M", "N", "K"] and "dtype" in params
    assert fn.__doc__ and len(fn.__doc__.strip()) > 100, "each builder carries a step card"
    assert step.lesson and step.constraints and step.sass_expect
    if step.sm_count_kwarg:  # persistent steps size their CTA pool to the GPU
        assert step.sm_count_kwarg in params


def test_get_errors_are_clear():
    with pytest.raises(ValueError, match="unknown arch"):
        registry.get("v1", "sm_80")
    with pytest.raises(ValueError, match="no step 'v99'"):
        registry.get("v99", "sm_100a")
    assert registry.get("4", "sm_100a").id == "v4"


# --- each step's static facts, declared once in the registry ---

def _builder_def(step):
    import ast
    from pathlib import Path
    tree = ast.parse(Path(step.source_file).read_text(encoding="utf-8"))
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef)
                and n.name == f"hgemm_{step.id}")


def _written_tile(step) -> dict:
    """BLK_M, BLK_N, BLK_K as the builder writes them: keyword defaults, then the first
    top-level assignments of its body, then the module's own constants, as far as they
    evaluate (a name like W.FP8_BLK_K is left out)."""
    import ast
    from pathlib import Path
    fn = _builder_def(step)
    module = ast.parse(Path(step.source_file).read_text(encoding="utf-8"))
    env: dict = {}
    args = fn.args.args + fn.args.kwonlyargs
    defaults = [None] * (len(fn.args.args) - len(fn.args.defaults)) + list(fn.args.defaults) \
        + list(fn.args.kw_defaults)
    for a, d in zip(args, defaults):
        if a.arg.startswith("BLK_") and isinstance(d, ast.Constant):
            env[a.arg] = d.value
    for node in [*fn.body, *module.body]:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        t, v = node.targets[0], node.value
        pairs = (zip(t.elts, v.elts) if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple)
                 else [(t, v)])
        for name, val in pairs:
            if isinstance(name, ast.Name) and name.id in ("BLK_M", "BLK_N", "BLK_K") \
                    and name.id not in env:
                try:
                    env[name.id] = eval(compile(ast.Expression(val), "<tile>", "eval"), {}, env)
                except Exception:  # noqa: BLE001 - a module constant (W.FP8_BLK_K)
                    pass
    return env


@pytest.mark.parametrize("step", registry.STEPS, ids=lambda s: s.key)
def test_the_registrys_tile_is_the_one_the_builder_writes(step):
    written = _written_tile(step)
    assert {"BLK_M", "BLK_N"} <= set(written), (step.key, written)
    declared = dict(zip(("BLK_M", "BLK_N", "BLK_K"), step.tile))
    assert {k: declared[k] for k in written} == written, step.key


@pytest.mark.parametrize("step", registry.STEPS, ids=lambda s: s.key)
def test_the_registrys_cluster_is_the_builders(step):
    from pathlib import Path
    from tirx_gemm import spec
    src = Path(step.source_file).read_text(encoding="utf-8")
    clustered = "W.CTA_PAIR" in src or "W.CLUSTER_SIZE" in src
    assert step.cluster == (spec.CLUSTER_SIZE if clustered else 1), step.key
    assert (step.cluster_tile is not None) == clustered, step.key
    assert step.default_sm_count == (spec.SM_COUNT[step.arch] if step.sm_count_kwarg else None)


def test_each_step_has_one_base_on_its_track_named_by_its_card():
    """Step.base is the one notion of "the step this one changes": earlier on the same
    track, None for the first step only, and the step card's "Changes from vN" names it."""
    import ast
    import re
    for arch in registry.ARCHES:
        ids = [s.id for s in registry.all_steps(arch)]
        for s in registry.all_steps(arch):
            if s.base is None:
                assert ids.index(s.id) == 0, s.key
                continue
            assert s.base in ids[:ids.index(s.id)], (s.key, s.base)
            assert registry.base_of(s) == registry.get(s.base, arch)
            card = ast.get_docstring(_builder_def(s)) or ""
            named = re.search(r"Changes from (v\d+)\b", card)
            assert named and named.group(1) == s.base, (s.key, s.base)
    assert registry.base_of(registry.get("v1", "sm_90a")) is None


def test_matmul_v9_cluster_tiles_are_the_registrys():
    """matmul.V9_CLUSTER_TILE is a copy (matmul is being refactored): it must agree."""
    from tirx_gemm import matmul
    assert matmul.V9_CLUSTER_TILE == {a: registry.get("v9", a).output_tile
                                      for a in matmul.V9_CLUSTER_TILE}
    assert matmul.CLUSTER_SIZE == registry.get("v9", "sm_90a").cluster


def test_split_k_and_chooser_tiles_are_the_registrys():
    """splitk.TILES and cm.V10_TILE are copies (both modules are being changed
    elsewhere): they must agree with v11's and v10's registry tiles."""
    from tirx_gemm import splitk
    from tirx_gemm.op import cost_model as cm, rules
    assert splitk.TILES == {a: registry.get("v11", a).tile for a in splitk.TILES}
    assert cm.V10_TILE == registry.get("v10", "sm_90a").tile[:2]
