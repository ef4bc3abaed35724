"""How big is each lesson? Code-only diff sizes between the step builders.

Counts the changed lines (added + removed) of a line diff between two step files after
dropping comments, docstrings and blank lines, so what is counted is code a reader has
to compare:

* step diffs: ``steps/<arch>/hgemm_<base>.py`` -> ``hgemm_vN.py`` for each arch, where
  base is the step vN changes (the registry's ``Step.base``, the base of the notebooks'
  diffs too; a file the registry does not know is compared with the step file before it),
* twin diffs: ``steps/sm100a/hgemm_vN.py`` vs ``steps/sm90a/hgemm_vN.py`` for each step.

    python scripts/diff_sizes.py                 # the working tree
    python scripts/diff_sizes.py --rev HEAD~3    # the files as committed in a revision
    python scripts/diff_sizes.py --before HEAD   # a revision and the working tree side by side
    python scripts/diff_sizes.py --before HEAD --skip v8   # sm_100a v7 -> v9 in both columns

Which lines are code and how two files' code lines are matched is
``tirx_gemm.sourceview``'s, the rules of the notebooks' code-only diffs
(``tirx_gemm.notebook.step_diff``), so a size here is the size of the diff a notebook
shows. Only the standard library, that module and the registry (no TVM); reads files (and
``git show`` for a revision), builds nothing. The bases are the working tree's registry's,
also for ``--rev``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing: import tirx_gemm here
    sys.path.insert(0, str(ROOT))

from tirx_gemm import registry  # noqa: E402
from tirx_gemm.sourceview import changed_lines  # noqa: E402
FOLDERS = {a.replace("_", ""): a for a in registry.ARCHES}  # steps/ folder -> arch
ARCHES = tuple(FOLDERS)


def read(arch: str, step: str, rev: str | None) -> str | None:
    rel = f"steps/{arch}/hgemm_{step}.py"
    if rev is None:
        p = ROOT / rel
        return p.read_text(encoding="utf-8") if p.exists() else None
    proc = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{rel}"],
                          capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else None


def step_ids(rev: str | None) -> list[str]:
    ids = set()
    for arch in ARCHES:
        if rev is None:
            names = [p.name for p in (ROOT / "steps" / arch).glob("hgemm_v*.py")]
        else:
            proc = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only",
                                   f"{rev}:steps/{arch}"], capture_output=True, text=True)
            names = proc.stdout.split()
        ids.update(m.group(1) for n in names if (m := re.fullmatch(r"hgemm_(v\d+)\.py", n)))
    return sorted(ids, key=lambda s: int(s[1:]))


def base(arch: str, step: str, ids: list[str], skip=()) -> str | None:
    """The step ``step`` is compared with on ``arch`` (a steps/ folder name): its registry
    base, or the base's base while that is skipped; for a step the registry does not know,
    the step file before it in ``ids``."""
    known = {s.id: s.base for s in registry.all_steps(FOLDERS[arch])}
    if step in known:
        b = known[step]
        while b is not None and b in skip:
            b = known.get(b)
        return b
    i = ids.index(step)
    return ids[i - 1] if i > 0 else None


def sizes(rev: str | None, skip=()) -> dict[str, int | None]:
    """{"sm100a v1->v2": n, ..., "twin v1": n, ...}; None where a file is missing. Steps in
    ``skip`` are left out (a step whose base is skipped is compared with the base's base)."""
    ids = [s for s in step_ids(rev) if s not in skip]
    text = {(a, s): read(a, s, rev) for a in ARCHES for s in ids}
    out: dict[str, int | None] = {}
    for arch in ARCHES:
        for t in ids:
            s = base(arch, t, ids, skip)
            if s is None or text[arch, t] is None:
                continue
            a, b = read(arch, s, rev), text[arch, t]
            out[f"{arch} {s}->{t}"] = None if a is None else changed_lines(a, b)
    for s in ids:
        a, b = text["sm100a", s], text["sm90a", s]
        out[f"twin {s}"] = None if a is None or b is None else changed_lines(a, b)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", help="measure the files of this git revision instead of the "
                                  "working tree")
    ap.add_argument("--before", help="also measure this revision and print both columns")
    ap.add_argument("--skip", default="", help="comma list of step ids to leave out, e.g. "
                                               "v10 (its neighbours are then compared)")
    args = ap.parse_args(argv)
    skip = tuple(s for s in args.skip.split(",") if s)
    now = sizes(args.rev, skip)
    label = args.rev or "working tree"
    fmt = lambda v: "-" if v is None else str(v)  # noqa: E731
    if args.before:
        old = sizes(args.before, skip)
        print(f"{'diff (code lines changed)':26} {args.before:>12} {label:>14}")
        for k in sorted(set(old) | set(now), key=_order):
            print(f"{k:26} {fmt(old.get(k)):>12} {fmt(now.get(k)):>14}")
        for kind in ("sm100a", "sm90a", "twin"):
            o = sum(v for k, v in old.items() if k.startswith(kind) and v is not None
                    and k in now and now[k] is not None)
            n = sum(v for k, v in now.items() if k.startswith(kind) and v is not None
                    and k in old and old[k] is not None)
            print(f"{'total ' + kind + ' (both present)':26} {o:>12} {n:>14}")
    else:
        print(f"{'diff (code lines changed)':26} {label:>14}")
        for k in sorted(now, key=_order):
            print(f"{k:26} {fmt(now[k]):>14}")
    return 0


def _order(key: str):
    kind, rest = key.split(" ", 1)
    first = int(re.match(r"v(\d+)", rest).group(1))
    return ({"sm100a": 0, "sm90a": 1, "twin": 2}[kind], first)


if __name__ == "__main__":
    sys.exit(main())
