"""Execute one notebook headless (nbclient) with this interpreter and keep a readable log.

For a GPU host: there the step notebooks check and time the step from an exported bundle
(set TIRX_GEMM_BUNDLE) and skip the cells that need TVM's compiler, saying so.

    TIRX_GEMM_BUNDLE=build/bundle python scripts/run_notebook.py 07_warp_specialization \\
        --out lab/steps_on_h200/logs/h200_notebook_07.log [--executed OUT.ipynb]

Exit 0 when every cell ran without an error; the log holds each cell's source and its
text output (images are noted, not embedded).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CELL_TIMEOUT_S = 600


def _text(out: dict) -> str:
    if out.get("output_type") == "stream":
        return out.get("text", "")
    if out.get("output_type") == "error":
        return f"{out.get('ename')}: {out.get('evalue')}"
    data = out.get("data", {})
    for kind in ("text/markdown", "text/plain"):
        if kind in data:
            return data[kind] if isinstance(data[kind], str) else "".join(data[kind])
    return "[" + ", ".join(sorted(data)) + "]"


def main(argv=None) -> int:
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebook", help="name in notebooks/, with or without .ipynb")
    ap.add_argument("--out", required=True, help="text log to write")
    ap.add_argument("--executed", help="also write the executed notebook here")
    args = ap.parse_args(argv)
    path = ROOT / "notebooks" / (args.notebook.removesuffix(".ipynb") + ".ipynb")
    if not path.is_file():
        print(f"run_notebook: error: no notebook {path}", file=sys.stderr)
        return 2
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as kdir:
        (Path(kdir) / "python3").mkdir()
        (Path(kdir) / "python3" / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3", "language": "python"}))
        ksm = KernelSpecManager(kernel_dirs=[kdir], ensure_native_kernel=False)
        km = KernelManager(kernel_name="python3", kernel_spec_manager=ksm)
        client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S, allow_errors=False,
                                resources={"metadata": {"path": str(path.parent)}})
        failed = None
        try:
            env = dict(os.environ)
            if env.get("TIRX_GEMM_BUNDLE"):  # the kernel runs in notebooks/: make it absolute
                env["TIRX_GEMM_BUNDLE"] = str(Path(env["TIRX_GEMM_BUNDLE"]).resolve())
            client.execute(env=env)
        except CellExecutionError as e:
            failed = str(e).strip().splitlines()[-1] if str(e).strip() else "cell error"
        finally:
            if km.has_kernel:
                km.shutdown_kernel(now=True)
    lines = [f"# {path.name} executed headless with {sys.executable}"]
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        lines.append(f"\n>>> {cell.source}")
        lines.extend(_text(o).rstrip() for o in cell.get("outputs", []))
    lines.append(f"\n# result: {'FAILED: ' + failed if failed else 'every cell ran without an error'}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    if args.executed:
        nbformat.write(nb, args.executed)
    print(lines[-1])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
