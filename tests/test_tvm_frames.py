"""tirx_gemm/tvm_frames.py: its two frame walks give what TVM's own inspect calls give, and a
step built with them is the same PrimFunc."""

import pytest

tvm = pytest.importorskip("tvm")

from tirx_gemm import registry, tvm_frames  # noqa: E402


@pytest.fixture
def tvm_own():
    """TVM's functions, whatever install() did before; the walk restored after."""
    was = tvm_frames._STATE["installed"]
    tvm_frames.uninstall()
    from tvm.script.parser.core import parser as core_parser
    from tvm.tirx.script.builder import ir
    yield core_parser.ScriptMacro._find_parser_def, ir._record_meta_resource
    if was:
        tvm_frames.install()


def _call_under_parser(fn, marker):
    """fn() called two frames below a module whose globals hold a parser object."""
    from tvm.script.parser.core.parser import ScriptMacro
    space = {ScriptMacro.parser_object_name: marker, "fn": fn}
    exec("def outer():\n    return inner()\ndef inner():\n    return fn()\n", space)
    return space["outer"]()


def test_parser_lookup_finds_the_same_parser(tvm_own):
    own_find, _ = tvm_own
    marker = object()
    assert _call_under_parser(lambda: own_find(None), marker) is marker
    assert _call_under_parser(lambda: tvm_frames.find_parser_def(None), marker) is marker
    with pytest.raises(RuntimeError, match="not available"):
        own_find(None)
    with pytest.raises(RuntimeError, match="not available"):
        tvm_frames.find_parser_def(None)


def test_meta_records_name_the_same_file_line_column_and_code(tvm_own):
    from tvm.tirx.script.builder import ir
    _, own_record = tvm_own

    def records(fn):
        class Meta:
            pass
        with ir._with_meta_construction_scope(Meta(), Meta) as scope:
            for v in ("a", "b"):
                helper(fn, v)  # the same call site for both functions
        return [(r.value, r.filename, r.lineno, r.colno, r.code) for r in scope.created]

    def helper(fn, v):
        return fn(v, skip_frames=2)

    mine, theirs = records(tvm_frames.record_meta_resource), records(own_record)
    assert mine and len(mine) == 2
    # same frame: this file's helper() call line (its caller's caller), same column and code
    assert [r[1:] for r in mine] == [r[1:] for r in theirs]
    assert mine[0][1] == __file__ and "helper(fn, v)" in mine[0][4]
    # no scope: nothing recorded, nothing raised
    assert tvm_frames.record_meta_resource("x") is None


def test_a_step_is_the_same_primfunc_with_either(tvm_own, monkeypatch):
    """v4 on sm_100a calls TVM macros (the parser lookup) and declares buffers: its script
    is identical built with TVM's inspect calls and with the walk."""
    step = registry.get("v4", "sm_100a")
    monkeypatch.setenv(tvm_frames.ENV, "inspect")
    theirs = step.build_primfunc(256, 128, 192).script()
    assert not tvm_frames._STATE["installed"]
    monkeypatch.setenv(tvm_frames.ENV, "walk")
    mine = step.build_primfunc(256, 128, 192).script()
    assert tvm_frames._STATE["installed"]
    assert mine == theirs


def test_another_tvm_is_left_alone(tvm_own, monkeypatch):
    monkeypatch.setattr(tvm, "__version__", "0.28.0")
    assert tvm_frames.install() is False and not tvm_frames._STATE["installed"]


def test_the_setting_is_checked(monkeypatch):
    monkeypatch.setenv(tvm_frames.ENV, "fast")
    with pytest.raises(ValueError, match=tvm_frames.ENV):
        tvm_frames.wanted()
