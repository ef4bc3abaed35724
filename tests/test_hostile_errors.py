"""Every run-side error is one line and exit 2 on every command: no GPU of the
arch, TVM's runtime libraries missing, a kernel that faulted. The conditions are faked
(monkeypatch), so these run on a CPU machine and a GPU host alike."""
import sys

import pytest

from tirx_gemm import cli
from tirx_gemm.cli import export, gpu
from tirx_gemm.run import errors


def _one_line(capsys, rc, needle):
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert rc == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("tirx-gemm: error: ") and needle in lines[0], err


# the command -> the module attribute its parser binds (register reads it when main runs)
COMMANDS = {
    "run": (["run", "v4", "--arch", "sm_90a"], gpu, "cmd_run"),
    "bench": (["bench", "--arch", "sm_90a"], gpu, "cmd_bench"),
    "regress": (["regress"], gpu, "cmd_regress"),
    "export": (["export", "v4", "--arch", "sm_90a"], export, "cmd_export"),
}


def _launcher_error():
    """launcher.py's own KernelLaunchError (it may still define its own class)."""
    launcher = pytest.importorskip("tirx_gemm.run.launcher")
    return launcher.KernelLaunchError


@pytest.mark.parametrize("error", ["DeviceMismatchError", "RuntimeLibraryError",
                                   "KernelLaunchError", "launcher.KernelLaunchError"])
@pytest.mark.parametrize("command", sorted(COMMANDS) + ["trace"])
def test_every_run_side_error_is_one_line_and_exit_2(monkeypatch, capsys, command, error):
    cls = _launcher_error() if error.startswith("launcher.") else getattr(errors, error)
    if command == "trace":
        from tirx_gemm.cli import trace
        argv, mod, attr = ["trace", "v4"], trace, "trace_main"
    else:
        argv, mod, attr = COMMANDS[command]

    def fail(args):
        raise cls(f"planted {error} for {command}")

    monkeypatch.setattr(mod, attr, fail)
    _one_line(capsys, cli.main(argv), f"planted {error} for {command}")


def test_old_homes_still_name_the_same_classes():
    device = pytest.importorskip("tirx_gemm.run.device")  # imports torch
    from tirx_gemm.run import loader
    assert device.DeviceMismatchError is errors.DeviceMismatchError
    assert loader.RuntimeLibraryError is errors.RuntimeLibraryError


def test_errors_module_needs_no_torch():
    """The CLI names the run side's errors without importing torch."""
    import subprocess
    code = ("import sys; import tirx_gemm.run.errors, tirx_gemm.cli; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr


def test_trace_without_a_gpu_is_one_line(monkeypatch, capsys):
    """The real path: `tirx-gemm trace v4` on a machine whose torch sees no CUDA GPU."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _one_line(capsys, cli.main(["trace", "v4", "--arch", "sm_90a"]), "no CUDA GPU visible")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cli.main(["trace", "v4", "--arch", "sm_90a"])
    err = capsys.readouterr().err
    assert "tirx-gemm export v4 --arch sm_90a --timeline" in err and "trace v4" in err


def test_loader_without_runtime_libraries_is_one_line(monkeypatch, capsys, tmp_path):
    """A wrong TIRX_GEMM_TVM_RUNTIME_DIR reaches the user as one line from `run`."""
    from tirx_gemm.run import loader
    monkeypatch.setenv(loader.RUNTIME_DIR_ENV, str(tmp_path))

    def run_like(args):
        loader.find_runtime_dir()
        return 0

    monkeypatch.setattr(gpu, "cmd_run", run_like)
    _one_line(capsys, cli.main(["run", "v4", "--arch", "sm_90a"]), "does not contain")


# --------------------------------------------------------------------------------------
# a shape a step cannot take is refused from the registry's words, before TVM loads
# --------------------------------------------------------------------------------------
from tirx_gemm import registry  # noqa: E402


def test_every_registry_shape_passes_the_precheck_and_invalid_ones_mostly_fail():
    """No false refusal: every shape the registry calls valid passes; and the pre-check
    catches the invalid shapes its constraint words describe."""
    caught = total = 0
    for step in registry.STEPS:
        for mnk in (step.canonical, *step.test_shapes, *step.bench_shapes,
                    *(shape for shape, _ in step.sim_cases)):
            assert cli.shape_breaks(step, mnk) is None, (step.key, mnk)
        for mnk in step.invalid_shapes:
            total += 1
            caught += cli.shape_breaks(step, mnk) is not None
    assert caught == total, f"{caught}/{total} invalid shapes caught before TVM"


@pytest.mark.parametrize("argv,needle", [
    (["build", "v1", "--mnk", "256,128,64"], "M = N = 128"),
    (["show", "v3", "--mnk", "200,128,64"], "M, N multiples of 128"),
    (["build", "v4", "--mnk", "128,130,64", "--arch", "sm_90a"], "N, K multiples of 8"),
    (["export", "v2", "--mnk", "128,128,96", "--out", "/nonexistent/never"], "K a multiple of 64"),
    (["run", "v1", "--mnk", "128,128,128"], "K = 64"),
    (["sim", "v1", "--mnk", "128,128,32"], "K = 64"),
])
def test_a_shape_the_step_cannot_take_is_refused_before_tvm(capsys, argv, needle):
    import subprocess
    code = ("import sys; from tirx_gemm import cli; rc = cli.main(sys.argv[1:]); "
            "sys.exit(100 + rc if 'tvm' in sys.modules else rc)")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                         timeout=300)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, (out.returncode, out.stderr)  # 102: TVM was loaded
    assert len(lines) == 1 and needle in lines[0] and "cannot take" in lines[0], out.stderr
