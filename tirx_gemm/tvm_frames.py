"""Faster frame lookups in TVM 0.27.0.post1's script parser (same result, less time).

Two places of TVM's TIRx script front end look up the calling frames with ``inspect``:

- every ``T.macro`` call finds the active parser (``ScriptMacro._find_parser_def``) through
  ``inspect.getouterframes``, which reads the source line of *every* outer frame (file
  lookups through ``sys.modules`` for each) only to read each frame's globals;
- every buffer declared inside a meta class (``_record_meta_resource``) takes
  ``inspect.stack()``, again source lines for every frame, to keep one of them.

A step's build makes about a hundred macro calls, so on this project's steps these lookups
were about half of the time spent parsing a kernel (v9 sm_100a: 12.8 s of 22 s under
cProfile on the 2-core build machine). ``install()`` replaces both with a walk along
``frame.f_back`` that visits the same frames in the same order and builds a frame info only
for the frame kept, so the parser gets the same object (the macro's parser; the record's
file, line, column and code). It is applied before a step is built (registry.build_primfunc)
and only to the TVM version it was written against; ``TIRX_GEMM_TVM_FRAMES=inspect`` leaves
TVM as it is. tests/test_tvm_frames.py checks both replacements against TVM's own code and
that a step's built kernel is byte-identical with and without them.
"""

from __future__ import annotations

import inspect
import sys

from tirx_gemm import settings

FOR_TVM = "0.27.0.post1"
ENV = "TIRX_GEMM_TVM_FRAMES"  # "walk" (the default) or "inspect" (TVM's own code)
_STATE: dict = {"installed": False, "originals": None}


def _frame_info(frame) -> inspect.FrameInfo:
    """What inspect.getouterframes (context 1) makes of one frame."""
    tb = inspect.getframeinfo(frame, 1)
    return inspect.FrameInfo(frame, *tb, positions=tb.positions)


def find_parser_def(self):
    """ScriptMacro._find_parser_def: the nearest outer frame whose globals hold the parser."""
    from tvm.script.parser.core.parser import ScriptMacro
    frame = sys._getframe(0)
    while frame is not None:
        parser = frame.f_globals.get(ScriptMacro.parser_object_name)
        if parser is not None:
            return parser
        frame = frame.f_back
    raise RuntimeError(f"{ScriptMacro.parser_object_name} not available")


def _filename(frame) -> str:
    """inspect.getframeinfo's filename for a frame, without reading source lines."""
    return inspect.getsourcefile(frame) or inspect.getfile(frame)


def record_meta_resource(value, skip_frames: int = 2) -> None:
    """ir._record_meta_resource: the first frame from the caller's caller on whose file is
    not ir.py (TVM's fallback when there is none), recorded in the active meta scope."""
    from tvm.tirx.script.builder import ir
    scope = ir._current_meta_construction_scope()
    if scope is None:
        return
    frames = []
    frame = sys._getframe(0)  # TVM's inspect.stack() starts at _record_meta_resource
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    for candidate in frames[2:]:
        if _filename(candidate) != ir._THIS_FILE:
            scope.record(value, _frame_info(candidate))
            return
    scope.record(value, _frame_info(frames[min(skip_frames + 1, len(frames) - 1)]))


def wanted(environ=None) -> bool:
    return settings.get(ENV, environ=environ) != "inspect"


def install() -> bool:
    """Replace TVM's two frame lookups (idempotent). False, changing nothing, when the
    installed TVM is not FOR_TVM or the user chose TVM's own code (TIRX_GEMM_TVM_FRAMES)."""
    if _STATE["installed"]:
        return True
    if not wanted():
        return False
    import tvm
    if getattr(tvm, "__version__", None) != FOR_TVM:
        return False
    from tvm.script.parser.core import parser as core_parser
    from tvm.tirx.script.builder import ir
    originals = (core_parser.ScriptMacro._find_parser_def, ir._record_meta_resource)
    core_parser.ScriptMacro._find_parser_def = find_parser_def
    ir._record_meta_resource = record_meta_resource
    _STATE.update(installed=True, originals=originals)
    return True


def uninstall() -> None:
    """TVM's own functions back (for the tests that compare both)."""
    if not _STATE["installed"]:
        return
    from tvm.script.parser.core import parser as core_parser
    from tvm.tirx.script.builder import ir
    core_parser.ScriptMacro._find_parser_def, ir._record_meta_resource = _STATE["originals"]
    _STATE.update(installed=False, originals=None)
