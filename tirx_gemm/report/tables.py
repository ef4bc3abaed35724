"""The table renderers: markdown (README, notebooks) and fixed-width text (the CLI).

Every table the project prints or writes goes through these two functions, so a cell is
escaped and a missing value shown the same way everywhere. Standard library only.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from tirx_gemm.stepshape import shape_text

__all__ = ["MISSING", "cell", "markdown", "text", "fmt", "shape", "path_table"]

MISSING = "—"  # a cell without a value (markdown)


def cell(x) -> str:
    """One markdown cell: None or "" -> MISSING; "|" escaped; newlines folded."""
    if x is None or x == "":
        return MISSING
    return str(x).replace("|", "\\|").replace("\n", " ")


def markdown(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    """A markdown table (no trailing newline): a header row, a ``|---|`` rule, the rows."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(value, spec: str, missing: str = "-") -> str:
    """``format(value, spec)`` for a number, ``missing`` for anything else (None)."""
    return format(value, spec) if isinstance(value, (int, float)) else missing


def text(header: Sequence[str], rows: Iterable[Sequence], align: str = "") -> str:
    """A fixed-width text table (no trailing newline). ``align`` has one character per
    column, "<" or ">" (default "<"); each column is as wide as its widest cell; the last
    column is not padded, and a row with fewer cells (a note such as "FAILED: ...") simply
    ends early."""
    rows = [[str(x) for x in row] for row in rows]
    n = len(header)
    align = (align + "<" * n)[:n]
    widths = [max([len(header[i])] + [len(r[i]) for r in rows if len(r) > i]) for i in range(n)]

    def line(cells):
        out = []
        for i, c in enumerate(cells):
            if i == len(cells) - 1 and i >= n - 1:
                out.append(c)
            else:
                w = widths[i] if i < n else 0
                out.append(f"{c:{align[i] if i < n else '<'}{w}}")
        return " ".join(out).rstrip()

    return "\n".join([line(list(header))] + [line(r) for r in rows])


shape = shape_text  # (M, N, K) -> "MxNxK", the one formatter (tirx_gemm.stepshape)


