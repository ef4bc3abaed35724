"""What the notebooks call, so that they stay thin (CONTRIBUTING.md, house style rule 10).

The notebooks in ``notebooks/`` are narrative plus one-line calls into this package; no
kernel code lives in them. Each job has its own module, and every name a notebook, a test
or a script uses is re-exported here (``tirx_gemm.notebook.<name>``):

- ``display``: Md, Png, Code, the objects every call returns (rendered by Jupyter, printed
  as plain text elsewhere, so the same calls work in a notebook, a terminal and headless CI);
- ``steps``: the registry seen from one step (its arches, card, base step, overview);
- ``builds``: builds at the canonical shapes (``tirx_gemm.compile.api``, cached on disk under
  ``TIRX_GEMM_CACHE``) and the resource and SASS tables made from them;
- ``sources``: the source views (TIRx source, code-only diffs, the CUDA excerpt), on the
  rules of ``tirx_gemm.sourceview`` that scripts/diff_sizes.py shares;
- ``results``: recorded results (``results/*.jsonl`` via ``tirx_gemm.report.records``),
  simulations, timelines, and runs through ``tirx_gemm.run`` where a GPU of the arch is here;
- ``suites``: the shape suite, what matmul picks for it and how it measured.

Importing this package imports neither TVM nor torch.
"""

from __future__ import annotations

from tirx_gemm.notebook.display import Code, Md, Png
from tirx_gemm.notebook.steps import (PKG_DIR, _card, arches, diff_base, path_table,
                                      previous_step_id, step_overview, steps_of)
from tirx_gemm.notebook.builds import (build_step, build_summary, canonical_build,
                                       compiler_missing, resource_overview, resource_table,
                                       sass_compare, sass_overview)
from tirx_gemm.notebook.sources import (code_diff, code_lines, cuda_excerpt, step_diff,
                                        step_source, twin_diff)
from tirx_gemm.notebook.results import (RESULTS_ENV, device_status, measure_or_recorded,
                                        plot_results, results_dir, results_for, results_table,
                                        sim_records, simulation, timeline)
from tirx_gemm.notebook.suites import (HELDOUT_RUN, _suite_text, chooser_table, suite_cases,
                                      suite_plot, suite_ratios)

__all__ = [
    "Md",
    "Png",
    "timeline",
    "steps_of",
    "arches",
    "previous_step_id",
    "results_dir",
    "canonical_build",
    "build_step",
    "build_summary",
    "compiler_missing",
    "step_overview",
    "resource_table",
    "sass_compare",
    "cuda_excerpt",
    "results_for",
    "results_table",
    "measure_or_recorded",
    "plot_results",
    "path_table",
    "resource_overview",
    "sass_overview",
    "device_status",
    "simulation",
    "sim_records",
    "Code",
    "code_lines",
    "code_diff",
    "diff_base",
    "step_source",
    "step_diff",
    "twin_diff",
    "suite_cases",
    "suite_ratios",
    "suite_plot",
    "chooser_table",
    "HELDOUT_RUN",
]
