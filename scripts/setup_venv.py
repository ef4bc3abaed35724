#!/usr/bin/env python3
"""Make (or reuse) a virtual environment for this checkout and install the project into it,
only when something changed: the README's and CI's set-up step.

    python3 scripts/setup_venv.py .venv --extra test --torch torch==2.13.0
    "$(scripts/find_python312.sh)" scripts/setup_venv.py .simvenv --extra sim

The venv is made with the interpreter that runs this script when VENV has none. The install
(``pip install TORCH`` first when --torch is given, then ``pip install -e ".[EXTRA]"``) runs
only when the stamp ``VENV/.tirx-gemm-setup`` does not cover the request. The stamp holds a
sha256 of pyproject.toml, this script, the checkout's path, the venv's interpreter and the
names of every distribution installed in it (so a package added, removed or upgraded by hand
makes the next run install again), and the extras and torch requirement installed. A request
is covered when that hash matches, its extras are among those installed and its torch (if
any) is the one installed: so a warm re-run installs nothing and says so, and the README's
two commands (no extra, then ``--extra test --torch ...``) can alternate without
reinstalling. An install that adds extras installs the union of the old and new ones.
``--force`` installs anyway. Every step prints its output and, when it
is silent for 10 s, a heartbeat line (scripts/heartbeat.py). Standard library only."""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heartbeat  # noqa: E402  (scripts/heartbeat.py)

ROOT = Path(__file__).resolve().parent.parent
STAMP = ".tirx-gemm-setup"


def _distributions(venv: Path) -> list[str]:
    """Every *.dist-info folder name (name-version) in the venv's site-packages."""
    return sorted(p.name for p in venv.glob("lib*/python*/site-packages/*.dist-info"))


def stamp_of(venv: Path, root: Path) -> str:
    """The hash of what an install depends on besides the request: the project's metadata,
    this script, the checkout, the venv's interpreter and its installed distributions."""
    h = hashlib.sha256()
    for part in [(root / "pyproject.toml").read_bytes(), Path(__file__).read_bytes(),
                 str(root).encode(), (venv / "pyvenv.cfg").read_bytes(),
                 "\n".join(_distributions(venv)).encode()]:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def read_stamp(stamp_file: Path) -> dict | None:
    """The last install's stamp ({"hash", "extras", "torch"}), or None (missing, or written
    by an older version of this script: then the next run installs)."""
    try:
        data = json.loads(stamp_file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("extras"), list):
        return None
    return data


def covered(stamp: dict | None, venv: Path, root: Path, extras: list[str],
            torch: str | None) -> bool:
    """Whether the last install already serves this request (nothing to install)."""
    return (stamp is not None and stamp.get("hash") == stamp_of(venv, root)
            and set(extras) <= set(stamp["extras"])
            and (torch is None or torch == stamp.get("torch")))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="setup_venv.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("venv", help="the virtual environment's folder (made when missing)")
    ap.add_argument("--extra", action="append", default=[],
                    help="an optional dependency group of pyproject.toml (test, sim, run, plot)")
    ap.add_argument("--torch", help="a torch requirement installed first (torch==2.13.0)")
    ap.add_argument("--force", action="store_true", help="install even when the stamp matches")
    ap.add_argument("--root", default=str(ROOT), help=argparse.SUPPRESS)  # tests only
    ap.add_argument("--every", type=float, default=heartbeat.HEARTBEAT_S, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    root, venv = Path(args.root).resolve(), Path(args.venv).resolve()
    t0 = time.monotonic()

    def say(line: str) -> None:
        print(f"set-up: {line} (elapsed {time.monotonic() - t0:.0f} s)", flush=True)

    def step(label: str, cmd: list[str]) -> None:
        say(f"{label}: {' '.join(cmd[2:] if cmd[1:2] == ['-m'] else cmd)}")
        rc = heartbeat.run(cmd, label, every=args.every, cwd=str(root))
        if rc:
            say(f"{label} failed (exit {rc}); nothing was stamped, the next run tries again")
            raise SystemExit(rc)

    if not (venv / "pyvenv.cfg").is_file():
        step("making the venv", [sys.executable, "-m", "venv", str(venv)])
    stamp_file = venv / STAMP
    old = read_stamp(stamp_file)
    if not args.force and covered(old, venv, root, args.extra, args.torch):
        say(f"{args.venv} is up to date (pyproject.toml and the installed packages are as "
            f"the last install left them, with extras {sorted(old['extras']) or 'none'}; "
            f"{STAMP} holds their hash): nothing to install, --force reinstalls")
        return 0
    # what an install adds keeps what the venv had (same project state): the union of extras
    same = old is not None and old.get("hash") == stamp_of(venv, root)
    extras = sorted(set(args.extra) | (set(old["extras"]) if same else set()))
    torch = args.torch or (old.get("torch") if same else None)
    stamp_file.unlink(missing_ok=True)
    py = str(venv / "bin" / "python")
    if args.torch:
        step(f"installing {args.torch}", [py, "-m", "pip", "install", args.torch])
    target = f".[{','.join(extras)}]" if extras else "."
    step("installing this project", [py, "-m", "pip", "install", "-e", target])
    stamp_file.write_text(json.dumps({"hash": stamp_of(venv, root), "extras": extras,
                                      "torch": torch}) + "\n")
    say(f"{args.venv} is ready; a re-run installs only when pyproject.toml or the venv changes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
