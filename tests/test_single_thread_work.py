"""One idiom per kind of single-thread work, on each track, from v1 to the last step.

sm_100a: a role is a warp. Async work a single thread starts -- a TMA load or store, an
MMA, a tcgen05.commit, a CLC request -- is issued by the lane ``T.cuda.elect_sync()``
picks in the warp that owns the role; mbarriers are initialised by ``lane_id == 0`` of
warp 0 (the warp that also allocates TMEM).
sm_90a: a role is a warpgroup and wgmma is issued by all of it; the producer is one
thread, and every single-thread job (barrier init, TMA loads and stores, their bulk
groups) is done by ``tid_in_wg == 0``.

The checks read the step sources' syntax trees (and the helpers that issue on a caller's
behalf), so a step that issues from some other guard fails here, whatever its comments
say.
"""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from support import ROOT
from tirx_gemm import blackwell, hopper
from tirx_gemm.registry import all_steps

# calls that start async work from one thread (attribute or plain name)
SM100A_ISSUE = {"tma_load_tiles", "tma_load_unit", "tma_load_pair", "tma_load_operand", "mma_tile",
                "mma_tile_at", "mma_tile_pair", "mma_tile_major", "mma_commit", "mma_commit_pair",
                "tma_store_swizzled"}
SM90A_ISSUE = {"tma_load_tiles", "tma_load_unit", "tma_load_operand", "tma_load_fp8_tiles",
               "tma_load_fp8_multicast_b", "tma_load_multicast_b", "tma_store_tile", "copy_async",
               "commit_group", "wait_group", "read"}
CLC_PTX = "clusterlaunchcontrol.try_cancel"


def _name(call: ast.Call) -> str | None:
    f = call.func
    if isinstance(f, ast.Attribute):
        return f.attr
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Subscript) and isinstance(f.slice, ast.Constant):
        return str(f.slice.value)  # T.ptx["..."](...)
    if isinstance(f, ast.Subscript):  # T.ptx["a" "b"] is folded to one Constant already
        return ast.unparse(f.slice)
    return None


def _guards(tree: ast.AST):
    """(call, [the tests of the `if`s enclosing it, innermost last]) for every call."""
    out = []

    def walk(node, tests):
        if isinstance(node, ast.If):
            walk_list(node.body, tests + [ast.unparse(node.test)])
            walk_list(node.orelse, tests + ["not " + ast.unparse(node.test)])
            return
        if isinstance(node, ast.Call):
            out.append((node, tests))
        for child in ast.iter_child_nodes(node):
            walk(child, tests)

    def walk_list(nodes, tests):
        for n in nodes:
            walk(n, tests)

    walk(tree, [])
    return out


def _step_tree(arch: str, step: str) -> ast.AST:
    path = ROOT / "steps" / arch.replace("_", "") / f"hgemm_{step}.py"
    return ast.parse(path.read_text())


def _steps(arch):
    return [s.id for s in all_steps(arch)]


def _issue_sites(tree, names):
    sites = []
    for call, tests in _guards(tree):
        n = _name(call)
        if n is None:
            continue
        if n in names or CLC_PTX in n:
            sites.append((n, call.lineno, tests))
    return sites


@pytest.mark.parametrize("step", _steps("sm_100a"))
def test_sm100a_issue_is_elected(step):
    sites = _issue_sites(_step_tree("sm_100a", step), SM100A_ISSUE)
    assert sites, f"{step}: no issue site found: the name list is out of date"
    bad = [(n, line, tests) for n, line, tests in sites if "T.cuda.elect_sync()" not in tests]
    assert not bad, f"sm_100a {step}: issued outside `if T.cuda.elect_sync():` {bad}"


@pytest.mark.parametrize("step", _steps("sm_100a"))
def test_sm100a_barriers_are_initialised_by_lane_0(step):
    inits = [(call.lineno, tests) for call, tests in _guards(_step_tree("sm_100a", step))
             if _name(call) == "init" and isinstance(call.func, ast.Attribute)
             and ast.unparse(call.func.value) != "scheduler"]
    assert inits, f"{step}: no barrier init found"
    bad = [(line, tests) for line, tests in inits
           if "lane_id == 0" not in tests[-2:] or "warp_id == 0" not in tests]
    assert not bad, f"sm_100a {step}: a barrier initialised outside warp 0's lane 0 {bad}"


def test_sm100a_no_lane_0_issue_guard_left():
    # the old idiom, `if lane_id == 0:` around an issue, anywhere in the track
    for step in _steps("sm_100a"):
        for n, line, tests in _issue_sites(_step_tree("sm_100a", step), SM100A_ISSUE):
            assert not any("lane_id == 0" in t or "tid_in_wg == 0" in t for t in tests), \
                (step, n, line, tests)


def test_sm100a_store_helpers_elect_the_issuer():
    # the epilogue helpers issue the TMA store for their caller: same idiom inside them
    # (every module of the blackwell package: stores.py holds them today)
    sites = [site for path in sorted(Path(blackwell.__file__).parent.glob("*.py"))
             for site in _issue_sites(ast.parse(path.read_text(encoding="utf-8")),
                                      {"tma_store_swizzled"})]
    assert len(sites) >= 2
    for n, line, tests in sites:
        assert tests[-1] == "T.cuda.elect_sync()", (n, line, tests)
        assert tests[-2] == "row < 32", (n, line, tests)


@pytest.mark.parametrize("step", [s for s in _steps("sm_90a") if int(s[1:]) >= 4])
def test_sm90a_single_thread_work_is_thread_0_of_the_warpgroup(step):
    sites = _issue_sites(_step_tree("sm_90a", step), SM90A_ISSUE)
    assert sites, f"{step}: no TMA site found"
    bad = [(n, line, tests) for n, line, tests in sites
           if not any(t == "tid_in_wg == 0" for t in tests)]
    assert not bad, f"sm_90a {step}: TMA work outside `if tid_in_wg == 0:` {bad}"
    assert "elect_sync" not in ast.unparse(_step_tree("sm_90a", step))


def test_sm90a_store_helper_issues_from_thread_0():
    # store_packed_chunk (the step store_packed_tile loops over)
    # issues its TMA store itself (tma_store_tile is called under the caller's guard,
    # which the step test above checks)
    tree = next(f for f in ast.walk(ast.parse(inspect.getsource(hopper.stores)))
                if isinstance(f, ast.FunctionDef) and f.name == "store_packed_chunk")
    sites = _issue_sites(tree, {"copy_async", "commit_group"})
    assert sites
    for n, line, tests in sites:
        assert "tid_in_wg == 0" in tests, (n, line, tests)
