"""The display objects every notebook call returns: markdown, a PNG, highlighted source.

Each renders itself in Jupyter and prints as plain text elsewhere, so the same calls work in
a notebook, in a terminal and in the headless CI run.
"""

from __future__ import annotations

import html

from tirx_gemm.report import tables

class Md:
    """Markdown text: rendered by Jupyter, printed as-is elsewhere."""

    def __init__(self, text: str):
        self.text = text.rstrip() + "\n"

    def _repr_markdown_(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__

    def __add__(self, other: "Md") -> "Md":
        return Md(self.text + "\n" + str(other))


class Png:
    """A rendered plot: Jupyter shows the image, a terminal gets the same data as text."""

    def __init__(self, png: bytes, text: str):
        self.png = png
        self.text = text

    def _repr_png_(self) -> bytes:
        return self.png

    def __repr__(self) -> str:
        return self.text


class Code:
    """Python source or a diff of it. Jupyter shows it as HTML, syntax-highlighted with
    pygments where it is installed (it comes with IPython) and as a plain ``<pre>`` with
    coloured +/- lines where not; printed, it is exactly ``text``."""

    _BG = {"+": "#e6ffec", "-": "#ffebe9", "@": "#ddf4ff"}

    def __init__(self, text: str, kind: str, title: str, *, first_line: int = 1):
        if kind not in ("python", "diff"):
            raise ValueError(f"kind {kind!r} must be 'python' or 'diff'")
        self.text, self.kind, self.title, self.first_line = text, kind, title, first_line

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__

    def _repr_html_(self) -> str:
        body = self._python_html() if self.kind == "python" else self._diff_html()
        return (f"<p><b>{html.escape(self.title)}</b></p>\n"
                '<div style="max-height:48em; overflow:auto; border:1px solid #d0d7de">'
                '<pre style="margin:0; padding:4px; line-height:1.3; font-size:12px">'
                + body + "</pre></div>")

    @staticmethod
    def _pygments(text: str) -> str | None:
        """The text as inline-styled HTML spans (no wrapper), or None without pygments."""
        try:
            from pygments import highlight
            from pygments.formatters import HtmlFormatter
            from pygments.lexers import PythonLexer
        except ImportError:
            return None
        out = highlight(text, PythonLexer(stripnl=False, ensurenl=False),
                        HtmlFormatter(noclasses=True, nowrap=True))
        return out

    def _python_html(self) -> str:
        lines = (self._pygments(self.text) or html.escape(self.text)).split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        width = len(str(self.first_line + len(lines)))
        return "\n".join(f'<span style="color:#8c959f">{self.first_line + i:>{width}} </span>'
                         + ln for i, ln in enumerate(lines))

    def _diff_html(self) -> str:
        out = []
        for line in self.text.splitlines():
            mark = line[:1]
            if line.startswith(("---", "+++")) or mark not in "+- ":
                out.append(f'<span style="display:block; background:{self._BG["@"]}; '
                           f'color:#57606a">{html.escape(line)}</span>')
                continue
            code = self._pygments(line[1:]) if line[1:].strip() else None
            code = html.escape(line[1:]) if code is None else code.rstrip("\n")
            style = f' style="display:block; background:{self._BG[mark]}"' if mark != " " \
                else ' style="display:block"'
            out.append(f"<span{style}>{html.escape(mark)}{code}</span>")
        return "".join(out)


_table = tables.markdown
_shape = tables.shape


def _kib(n) -> str:
    return "—" if n is None else f"{n / 1024:.1f} KiB"
