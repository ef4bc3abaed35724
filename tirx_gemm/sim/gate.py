"""Run the sm_100a steps on a CPU model of Blackwell: tirx-harness NumSim + its checkers.

There is no Blackwell GPU here, and compiling proves nothing about synchronization. NumSim
(PyPI ``tirx-harness``) executes a TIRx PrimFunc on a numerical model of sm_100a (tcgen05
MMA and TMEM, TMA, mbarrier phases and tx-counts) and two checkers run the same execution:
synccheck (deadlocks, barrier misuse, phase overtaking) and racecheck (races on
global/shared/TMEM, missing proxy fences).

For each simulation case of a step (``Step.sim_cases`` in the registry: shapes chosen to
exercise its protocol) the gate builds the PrimFunc, runs it on random inputs and on
small-integer inputs of the case's dtype (float16, or bfloat16 where the case's kwargs say
so) with D poisoned with NaN and the step's workspace operands (if any) zero-filled,
compares with the fp32 numpy reference under the runner's rules
(:mod:`tirx_gemm.numerics`), then runs synccheck and racecheck. A case with epilogue
keywords (BIAS, ACT, OUT_DTYPE, SWIGLU: :mod:`tirx_gemm.epilogue`) also gets its ``bias``
operand, D in its out dtype and SwiGLU's interleaved gate/up weight, and is compared with
``epilogue.reference_np`` under ``epilogue.tolerance``. An fp8 case (``Step.fp8``: v13)
gets one input set instead: randn quantized to e4m3 with its SCALE mode's fp32 scales
(``numerics.make_fp8_inputs_np``), A and B passed as their uint8 bytes, ``SA`` and ``SB``
after D, compared with the fp32 product of the dequantized inputs under
``numerics.compare_fp8_np`` (``input_kinds``, ``case_inputs_np``, ``check_output_np``).
A row passes only if every input set is correct and both checkers say ``clean``; a ``review``
finding passes only where the registry accepts its kind for that step with a written
reason; ``incomplete`` and ``error`` always fail.

What a pass means: the kernel computes the right numbers on the model and its barrier and
proxy protocol is free of the hazards the checkers look for, for that execution. It says
nothing about speed (the model has no timing) and it is a model, not silicon.

Needs Python >= 3.12 and ``tirx-harness`` (``pip install -e ".[sim]"``); no torch. The first
use builds the engines with cargo (minutes; cached under ``NUMSIM_BUILD_CACHE_DIR``).

The gate is one module per job, each name re-exported here (``tirx_gemm.sim.gate.<name>``
keeps working): environment (NumSim's set-up: the vendored crates, Rust, the opt level),
cases (what is simulated, the checks each case gets), inputs (operands, the output's check),
rows (verdicts, the table line, records), runcase (one case), batch (simulate: the pool, the
heartbeat, the log). A test that patches a name patches it where it is used.
"""

from __future__ import annotations

from tirx_gemm.sim.batch import (  # noqa: F401
    SimProgress, _case_in_worker, _descendant_commands, _pool, _quiet_native, _worker_init,
    default_log_path, simulate)
from tirx_gemm.sim.cases import (  # noqa: F401
    ARCH, CHECKS, SimCase, _with_dtype, cases_for, checks_for, mutant_case, mutant_cases)
from tirx_gemm.sim.environment import (  # noqa: F401
    _CRATES, _NETWORK, _VENDORED_HOME, CRATES_ENV, GATE_OPT_LEVEL, HARNESS_VERSION,
    OPT_LEVEL_ENV, VENDOR_ARCHIVE, VENDOR_DIR, VENDOR_SHA256, SimEnvironmentError,
    SimUnavailable, _harness_version, _rust_tool_missing, crates_dir, crates_note,
    environment_failure, unavailable_reason, unpack_crates, use_gate_opt_level,
    use_vendored_crates, vendored_home_in_use)
from tirx_gemm.sim.inputs import (  # noqa: F401
    _np_workspace_dtype, case_inputs_np, check_output_np, input_kinds, make_workspace_np,
    workspace_dirt_np, workspace_specs)
from tirx_gemm.sim.rows import (  # noqa: F401
    DEVICE, HEAD, RECORDS_FILE, SimRow, append_records, format_row, mutant_missed,
    row_verdict)
from tirx_gemm.sim.runcase import (  # noqa: F401
    RESIDENT_ATTR, _cancel_path_ok, _checker_verdict, _first_line, run_case)
