"""The git revision that results are recorded against (standard library and settings only)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tirx_gemm import settings

SHA_ENV = "TIRX_GEMM_GIT_SHA"


def git_sha(repo_dir: str | os.PathLike | None = None) -> str | None:
    """HEAD of the repository holding this file (or repo_dir), with "-dirty" appended when
    tracked sources of the package or the steps are modified; None without git.
    ``TIRX_GEMM_GIT_SHA`` set (non-empty) overrides it: a copy whose git state is not its
    files' (a device copy keeps the session's first commit) names the code it runs."""
    forced = settings.get(SHA_ENV)  # a one-line ValueError for a value not a revision
    if forced:
        return forced
    cwd = Path(repo_dir) if repo_dir else Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, timeout=5)
        if out.returncode != 0 or not out.stdout.strip():
            return None
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=cwd,
                             capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                "tirx_gemm", "steps"], cwd=top or cwd, capture_output=True,
                               text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() + ("-dirty" if dirty else "")
