"""Helpers the test files share (one copy each; fixtures are in tests/conftest.py):
running the CLI as a user does and reading its one-line errors, loading a script as a module."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# a progress line (tirx_gemm/progress.py) a slow machine may print before an error
PROGRESS = re.compile(r"^\S.*(: still working|: \d+/\d+ done.*), elapsed \d+ s$")


def load_script(rel: str, name: str | None = None):
    """The script at ``rel`` (a path under the checkout, e.g. "scripts/render_docs.py")
    imported as a module named ``name`` (default: the file's stem)."""
    import importlib.util
    path = ROOT / rel
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cli(*args, env=None, timeout=300):
    """``python -m tirx_gemm.cli ARGS`` from the checkout, output captured; ``env`` is added
    to this process's environment."""
    return subprocess.run([sys.executable, "-m", "tirx_gemm.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **(env or {})})


def one_line_error(out, needle):
    """Exit 2, no traceback, one error line naming ``needle`` (progress lines of a slow
    machine aside)."""
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    lines = [ln for ln in out.stderr.strip().splitlines() if not PROGRESS.match(ln)]
    assert len(lines) == 1 and "error:" in lines[0] and needle in lines[0], out.stderr


# decode shapes where the H100 and the H200 pick different kernels (the H100 runs the
# non-persistent kernel where a split in two would hold under 48 K steps a unit;
# lab/split_k_decode): the suite the card tests of bench and export plan
CARD_DECODE = [(5, 4096, 4096), (45, 2816, 2048)]


def write_card_suite(path: Path, name: str) -> Path:
    """The decode suite of CARD_DECODE (bfloat16) written to ``path`` as a suite file."""
    import json
    path.write_text(json.dumps({
        "name": name, "description": f"decode shapes for the {name} tests", "dtypes": ["bfloat16"],
        "shapes": [{"M": M, "N": N, "K": K, "model": "test", "layer": "q_proj", "why": "decode",
                    "all_m": False} for M, N, K in CARD_DECODE]}))
    return path
