"""One bundle for matmul as two checkouts choose it, so both packages can be timed from one
carry: every kernel this checkout's matmul asks for over the given suites, plus every
kernel the package at ``--before`` (a checkout of an earlier commit, e.g. a
``git worktree``, or a copy with a lab variant of matmul_choice) asks for over them. Every
kernel is built by this checkout's code, so the A/B is of the choice (matmul_choice,
chooser), not of the builders: the script refuses when the two checkouts' steps/ differ
(the same keywords could name other kernels there); the builders' helpers in tirx_gemm/
are this checkout's too. Extra kernels in a bundle are never asked for; each package finds
its own.

    python lab/tools/ab_bundle.py --before /tmp/oldwt [--before /tmp/variant ...] \
        --out .gpu/ab-bfloat16 SUITE.json [...]

(Plain tiles built for their N and K, swap-AB and pair kernels built for their N and K, and
PDL's exit trigger were each timed this way against the package before them, and the CTA
cluster variants of lab/cta_clusters against theirs: lab/tools/h200_ab.sh runs such a bundle.)
"""
from __future__ import annotations

import argparse
import filecmp
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# run by the --before checkout's python: its export requests as JSON lines
_DUMP = """
import json, sys
from tirx_gemm.op import suite as S
for path in sys.argv[1:]:
    for step, mnk, kw in S.export_requests(S.load_suite(path), "matmul", "sm_90a", 132):
        print(json.dumps([step.id, step.arch, list(mnk), kw]))
"""


def _same_steps(before: Path) -> list[str]:
    cmp = filecmp.dircmp(ROOT / "steps", before / "steps", ignore=["__pycache__"])
    diffs = []

    def walk(c, rel):
        diffs.extend(f"{rel}{n}" for n in c.diff_files + c.left_only + c.right_only)
        for name, sub in c.subdirs.items():
            walk(sub, f"{rel}{name}/")
    walk(cmp, "steps/")
    return diffs


def requests(suites, befores) -> list[tuple]:
    """Every kernel this checkout's matmul asks for over ``suites``, then every kernel each
    checkout in ``befores`` asks for that is not among them yet."""
    from tirx_gemm import registry
    from tirx_gemm.op import suite as S
    from tirx_gemm.op.keywords import build_shape
    out, seen = [], set()

    def add(step, mnk, kw):
        key = (step.key, build_shape(mnk, kw), tuple(sorted(kw.items())))
        if key not in seen:
            seen.add(key)
            out.append((step, build_shape(mnk, kw), dict(kw)))

    for path in suites:
        for step, mnk, kw in S.export_requests(S.load_suite(path), "matmul", "sm_90a", 132):
            add(step, mnk, kw)
    for before in befores:
        dump = subprocess.run([sys.executable, "-c", _DUMP, *map(str, suites)], cwd=before,
                              env={"PYTHONPATH": str(before), "PATH": "/usr/bin:/bin"},
                              check=True, capture_output=True, text=True).stdout
        for line in dump.splitlines():
            sid, arch, mnk, kw = json.loads(line)
            add(registry.get(sid, arch), tuple(mnk), kw)
    return out


def main(argv) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("suites", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--before", type=Path, action="append", default=[],
                   help="a checkout of a package to compare with (repeatable: one bundle "
                        "for them all)")
    a = p.parse_args(argv)
    for before in a.before:
        diffs = _same_steps(before.resolve())
        if diffs:
            print(f"error: steps/ differ from {before}: {', '.join(diffs)}", file=sys.stderr)
            return 2
    from tirx_gemm.compile import bundle
    reqs = requests([s.resolve() for s in a.suites], [b.resolve() for b in a.before])
    print(f"{len(reqs)} kernels")
    bundle.export(reqs, a.out, ffi_wheel_python="3.12")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
