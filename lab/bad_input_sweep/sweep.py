"""Bad and unusual inputs, tried as a new user would: each one in its own subprocess with a
timeout, classified, and written as one JSON line.

Usage:
    python lab/bad_input_sweep/sweep.py [--out FILE] [--only SUBSTR] [--jobs N] [--list]

The catalogue is in catalogue.py (Python API calls, CLI commands, suite files, bundles,
caches, settings variables, the op library's newer parts). Where a call needs a GPU, the
GPU host is emulated (``emulate()`` below): the device checks are skipped as
``require_cuda=False`` skips them in the tests, the arch probe answers sm_90a with 132 SMs,
and the kernel loader hands back a stand-in that computes what the kernel would (fp32
accumulation, the epilogue's bias, activation and SwiGLU, the output's dtype) with torch on
CPU, so a result can be compared with what the user asked for.

Outcomes:
    worked     the input is valid and the answer is right
    clear      refused (or warned about) in one line that names the input and a way out
    unclear    refused, but in more than one line, without naming the input, or without a
               way out
    traceback  a Python traceback reached the user, or an exception of an internal kind
               (AttributeError, KeyError, ...) or from inside torch or the standard library
    silent     accepted without a word where it should have been refused or warned about,
               or accepted and answered wrongly, or a refused command left a change behind
    hang       still running at the timeout

A case whose own code fails (an AttributeError in the snippet, not in a call) is counted as
"harness", outside the six: a fault of the catalogue, fixed there.
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import datetime as _dt
import json
import os
import platform
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CARD = "CPU, this machine"
OUTCOMES = ("worked", "clear", "unclear", "traceback", "silent", "hang")
# not an outcome of the project: the case's own code failed (fixed in the catalogue)
HARNESS = "harness"
DEFAULT_TIMEOUT = 60

# an exception of these kinds is a bug escaping, whatever its message
INTERNAL = {"AttributeError", "KeyError", "IndexError", "NameError", "UnboundLocalError",
            "AssertionError", "RecursionError", "ZeroDivisionError", "StopIteration",
            "UnicodeDecodeError", "UnicodeEncodeError", "JSONDecodeError", "IsADirectoryError",
            "NotADirectoryError", "BrokenPipeError", "MemoryError", "SystemError"}
# Python's own words for a bug (a wrong type met deep inside): a traceback whatever its kind
INTERNAL_MSG = re.compile(
    r"object is not (callable|subscriptable|iterable)|has no attribute|unsupported operand|"
    r"not supported between instances|takes \d+ positional|missing \d+ required|"
    r"too many values to unpack|not enough values to unpack|index out of range|"
    r"can only concatenate|bad operand type|cannot unpack non-iterable")
# words of a way out: what to pass, use, run, set, delete, ... or what was expected
WAY_OUT = re.compile(
    r"\b(pass|use|run|set|unset|choose|call|export|give|convert|pad|delete|remove|rebuild|"
    r"install|put|leave|fuse|split|try|expected|expects?|must|takes?|one of|needs?|should|"
    r"point|rename|copy|make|omit|drop|add|allowed|supported|only|instead|see|is not|not a|"
    r"invalid choice|invalid \w+ value|required|unrecognized|refused|no such|cannot|"
    r"does not exist|there is no|not found|missing|wants?|did you mean|at most|at least|"
    r"multiple of|exceeds|limit|runs on|are|or|not valid|too deeply|unknown|neither|create|"
    r"outside|"
    r"(line|byte|entry|record) \d+)\b|e\.g\.|\.\w+\(\)|:\d+: "
    r"|: [\w.'-]+(, [\w.'-]+){2,}", re.I)
# the second line of a two-line refusal that says how to go on (the CLI's GPU-host hint)
HINT = re.compile(r"^(to run it on |here: |on a \w+ GPU host|hint: )")
PROGRESS = re.compile(r"^\S.*(: still working|\b\d+/\d+\b.*)[, ] *elapsed \d+ s$")


@dataclass
class Case:
    """One input. ``kind`` "py" (``code``: the body of a function, run after PRELUDE),
    "cli" (``argv`` after ``python -m tirx_gemm.cli``) or "sh" (``argv`` run as is).
    ``expect``: "error" (must be refused), "warn" (must warn), "work" (must work; the code
    checks its answer with ``ok(...)``) or "either". ``needles``: words a clear message
    holds (the input's name or value). ``files``: relative path -> text/bytes written under
    the case's folder T first ("{T}" in argv, code, env and needles is that folder);
    ``setup``: a special setup ("readonly_dir", "symlink_loop", ...). ``unchanged``: paths
    under T that a refused command must leave as they were (a half-done change otherwise);
    ``absent``: paths it must not create. ``torch_ok``: an error raised by torch itself is
    the PyTorch convention here (nn.Linear's fallback), not an escape."""
    id: str
    group: str
    kind: str
    code: str = ""
    argv: list = field(default_factory=list)
    expect: str = "error"
    needles: tuple = ()
    files: dict = field(default_factory=dict)
    setup: tuple = ()
    env: dict = field(default_factory=dict)
    unchanged: tuple = ()
    absent: tuple = ()
    emulate: bool = False
    torch_ok: bool = False
    timeout: float = DEFAULT_TIMEOUT
    note: str = ""


PRELUDE = r'''
import sys, os, json, warnings, traceback
sys.path.insert(0, {root!r})
T = {T!r}
warnings.simplefilter("always")
_warned = []
_orig_showwarning = warnings.showwarning
def _show(message, category, filename, lineno, file=None, line=None):
    _warned.append(f"{{category.__name__}}: {{message}}")
warnings.showwarning = _show
_wrong = []
def ok(cond, why):
    if not cond:
        _wrong.append(why)
def close(x, ref, tol=2e-2):
    import torch
    x, ref = x.float(), ref.float()
    if x.shape != ref.shape:
        return False
    return bool(torch.allclose(x, ref, rtol=tol, atol=tol, equal_nan=True))

def emulate(arch="sm_90a", sms=132):
    """The GPU host, emulated on CPU tensors (see sweep.py's docstring)."""
    import torch
    import torch.nn.functional as F
    import tirx_gemm.op.matmul
    from tirx_gemm.op import operands, fp8 as _fp8
    mm = sys.modules["tirx_gemm.op.matmul"]
    from tirx_gemm import epilogue as E
    operands.check_operands.__kwdefaults__["require_cuda"] = False
    mm._epilogue_checks.__kwdefaults__["require_cuda"] = False
    _fp8.check_fp8_operands.__kwdefaults__["require_cuda"] = False
    mm._gpu_arch = lambda dev: (arch, sms)
    from tirx_gemm.op import layouts as _lay  # transposed views: v15 in place (sm_90a)
    _lay._arch_of.__kwdefaults__["require_cuda"] = False

    def v15_kernel(dtype, rows_a, rows_b, red, a_mn, b_mn, device, tune=None):
        def kernel(a, b, out):
            a2, b2 = (a.T if a_mn else a), (b.T if b_mn else b)
            out.copy_((a2.float() @ b2.float().T).to(out.dtype))
        return kernel
    mm.v15_kernel = v15_kernel
    mm.synchronize = lambda *a, **k: None
    torch.cuda.is_current_stream_capturing = lambda: False  # no capture on the stand-in
    try:  # a CUDA-graph capture probe: a CPU-only torch has no such thing to ask
        from tirx_gemm.run import workspace as _ws
        _ws.capturing = lambda *a, **k: False
        if hasattr(mm, "capturing"):
            mm.capturing = _ws.capturing
    except ImportError:
        pass
    G = E.SWIGLU_GROUP
    def result(a, b, kw, bias):
        acc = a.float() @ b.float().T
        if kw.get("SWIGLU"):
            M, N2 = acc.shape
            g = acc.view(M, N2 // (2 * G), 2, G)
            acc = (F.silu(g[:, :, 0]) * g[:, :, 1]).reshape(M, N2 // 2)
        if bias is not None:
            acc = acc + bias.float()
        act = kw.get("ACT")
        if act == "relu": acc = F.relu(acc)
        elif act == "gelu": acc = F.gelu(acc)
        elif act == "gelu_tanh": acc = F.gelu(acc, approximate="tanh")
        elif act == "silu": acc = F.silu(acc)
        return acc
    class Loaded:
        def __init__(self, st, kwargs):
            self.kw = dict(kwargs)
            def kernel(a, b, out, *rest):
                bias = rest[0] if rest and self.kw.get("BIAS") else None
                r = result(a, b, self.kw, bias)
                if tuple(out.shape) != tuple(r.shape) or not out.is_contiguous():
                    raise RuntimeError("stand-in kernel: out mismatch")
                if out.requires_grad:  # what DLPack export (TVM FFI's path) does
                    raise RuntimeError("Can't export tensors that require gradient, use "
                                       "tensor.detach()")
                out.copy_(r.to(out.dtype))
            self.kernel = kernel
        def workspace(self, *a):
            return ()
    def load(st, mnk, kwargs):
        mm.bundle_path()  # the real loader's first read (settings, the digest pin)
        return Loaded(st, kwargs)
    mm._load = load
    def fp8_kernel(kw, mnk):
        def kernel(a, b, out, sa, sb, *workspace):
            af = a.view(torch.float8_e4m3fn).float()
            bf = b.view(torch.float8_e4m3fn).float()
            M, K = af.shape; N = bf.shape[0]
            if sa.numel() == 1: af = af * sa.reshape(1, 1)
            elif sa.numel() == M: af = af * sa.reshape(M, 1)
            else: af = af * sa.repeat_interleave(128, 1)[:, :K]
            if sb.numel() == 1: bf = bf * sb.reshape(1, 1)
            elif sb.numel() == N: bf = bf * sb.reshape(N, 1)
            else: bf = bf * sb.repeat_interleave(128, 0).repeat_interleave(128, 1)[:N, :K]
            out.copy_((af @ bf.T).to(out.dtype))
        return kernel
    import inspect
    pair = "kernel, ws = _kernel(" in inspect.getsource(_fp8.matmul_fp8)  # (kernel, workspaces)
    _fp8._kernel = (lambda kw, mnk: (fp8_kernel(kw, mnk), None)) if pair else fp8_kernel
    try:
        from tirx_gemm.op import grouped as _g
    except ImportError:
        return
    _g.check_grouped.__kwdefaults__["require_cuda"] = False
    _g._gpu = lambda dev: (arch, sms)
    def per_expert(a, w, out, index, scale=None, bias=None):
        # w: (E, N, K); index: offs (2-D a) or counts (3-D a); v14's epilogue in fp32, one
        # rounding: (a_e @ w[e].T + bias[e]) * scale[row]
        def rows(e, a_e, s_e):
            acc = a_e.float() @ w[e].float().T
            if bias is not None:
                acc = acc + bias[e].float()
            if s_e is not None:
                acc = acc * s_e.float()[:, None]
            return acc.to(out.dtype)
        if a.dim() == 2:
            start = 0
            for e in range(w.shape[0]):
                end = int(index[e])
                if end > start:
                    out[start:end] = rows(e, a[start:end],
                                          None if scale is None else scale[start:end])
                start = max(start, end)
        else:
            for e in range(w.shape[0]):
                c = int(index[e])
                out[e, :c] = rows(e, a[e, :c], None if scale is None else scale[e, :c])
    def grouped_load(step_id, arch_, N, K, kwargs):
        def kernel(a, w, out, index, *epi):  # epi: [scale][, bias], v14's ROW_SCALE, BIAS
            epi = list(epi)
            scale = epi.pop(0) if kwargs.get("ROW_SCALE") else None
            bias = epi.pop(0) if kwargs.get("BIAS") else None
            per_expert(a, w, out, index, scale, bias)
        return kernel, "stand-in v14"
    _g._load = grouped_load
    try:
        from tirx_gemm.op import grouped_fp8 as _gf
    except ImportError:
        return
    _gf.check_grouped_fp8.__kwdefaults__["require_cuda"] = False
    _gf._gpu = lambda dev: (arch, sms)
    def grouped_fp8_load(step_id, arch_, N, K, kwargs):
        def kernel(a, w, out, index, sa, sb):  # v14 FP8_BLOCK: uint8 bytes, flattened scales
            E = w.shape[0]; KB = K // 128; NB = (N + 127) // 128
            wf = w.view(torch.float8_e4m3fn).float() * sb.view(E, NB, KB).repeat_interleave(
                128, 1)[:, :N].repeat_interleave(128, 2)
            af = a.reshape(-1, K).view(torch.float8_e4m3fn).float() * sa.repeat_interleave(128, 1)
            per_expert(af.view(a.shape), wf, out, index)
        return kernel, "stand-in v14 fp8"
    _gf._load = grouped_fp8_load

def _main():
{body}

try:
    _main()
except SystemExit:
    raise
except BaseException as exc:
    tb = traceback.extract_tb(exc.__traceback__)
    frames = [f.filename for f in tb]
    print("SWEEP-EXC " + json.dumps({{"type": type(exc).__name__, "msg": str(exc),
          "last": frames[-1] if frames else "", "frames": frames[-6:],
          "warnings": _warned}}), file=sys.stderr)
    sys.exit(3)
print("SWEEP-DONE " + json.dumps({{"wrong": _wrong, "warnings": _warned}}))
'''


# --------------------------------------------------------------------------------------
# setup of a case's folder
# --------------------------------------------------------------------------------------
def prepare(case: Case, T: Path) -> None:
    for rel, content in case.files.items():
        p = T / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content.replace("{T}", str(T)), encoding="utf-8")
    for item in case.setup:
        what, _, arg = item.partition(":")
        p = T / arg if arg else T
        if what == "readonly_dir":
            p.mkdir(parents=True, exist_ok=True)
            p.chmod(stat.S_IRUSR | stat.S_IXUSR)
        elif what == "symlink_loop":
            p.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(p.name, p)
        elif what == "symlink_to_dir":
            os.symlink(T, p)
        elif what == "dangling":
            os.symlink(T / "nowhere", p)
        elif what == "mkdir":
            p.mkdir(parents=True, exist_ok=True)
        elif what == "fifo":
            os.mkfifo(p)
        else:
            raise ValueError(f"unknown setup {item!r}")


def _fill(text: str, T: Path) -> str:
    return text.replace("{T}", str(T))


def snapshot(T: Path, rels) -> dict:
    out = {}
    for rel in rels:
        p = T / rel
        out[rel] = p.read_bytes() if p.is_file() else (sorted(os.listdir(p)) if p.is_dir()
                                                       else None)
    return out


# --------------------------------------------------------------------------------------
# running and classifying one case
# --------------------------------------------------------------------------------------
def _indent(code: str) -> str:
    lines = code.strip("\n").split("\n")
    return "\n".join("    " + ln for ln in lines) or "    pass"


def command(case: Case, T: Path) -> list[str]:
    if case.kind == "py":
        body = ("emulate()\n" if case.emulate else "") + case.code
        src = PRELUDE.format(root=str(ROOT), T=str(T), body=_indent(_fill(body, T)))
        return [sys.executable, "-c", src]
    if case.kind == "cli":
        return [sys.executable, "-m", "tirx_gemm.cli", *[_fill(a, T) for a in case.argv]]
    return [_fill(a, T) for a in case.argv]


# A Python case without settings variables of its own runs in a child forked from a warm
# process that has imported torch and tirx_gemm once (each case still gets a process of its
# own and a timeout; the import is the same one a fresh process would do). A case with
# ``env`` runs in a fresh interpreter, since settings are read at import.
ZYGOTE = r"""
import json, os, signal, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
import tirx_gemm.op.matmul, tirx_gemm.op.torch_op, tirx_gemm.op.nn, tirx_gemm.op.fp8
for extra in ("autograd", "grouped", "grouped_fp8", "moe", "fp8_nn"):
    try:
        __import__("tirx_gemm.op." + extra)
    except Exception:
        pass
out = sys.stdout
out.write("READY\n"); out.flush()
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.setsid()
        o = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        e = os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        n = os.open(os.devnull, os.O_RDONLY)
        os.dup2(n, 0); os.dup2(o, 1); os.dup2(e, 2)
        sys.stdout = os.fdopen(1, "w"); sys.stderr = os.fdopen(2, "w")
        code = 0
        try:
            exec(compile(req["src"], "<string>", "exec"), {"__name__": "__main__"})
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        try:
            sys.stdout.flush(); sys.stderr.flush()
        finally:
            os._exit(code)
    deadline = time.monotonic() + req["timeout"]
    rc = None
    while time.monotonic() < deadline:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got:
            rc = os.waitstatus_to_exitcode(status)
            break
        time.sleep(0.01)
    if rc is None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        os.waitpid(pid, 0)
    out.write(json.dumps({"rc": rc}) + "\n"); out.flush()
"""

import threading  # noqa: E402

_zygotes = threading.local()


def _zygote():
    z = getattr(_zygotes, "proc", None)
    if z is None or z.poll() is not None:
        env = {k: v for k, v in os.environ.items() if k != "TIRX_GEMM_DEBUG"}
        z = subprocess.Popen([sys.executable, "-c", ZYGOTE, str(ROOT)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        assert z.stdout.readline().strip() == "READY"
        _zygotes.proc = z
    return z


def _run_forked(src: str, T: Path, timeout: float):
    z = _zygote()
    out, err = T / ".case_stdout", T / ".case_stderr"
    z.stdin.write(json.dumps({"src": src, "out": str(out), "err": str(err),
                              "timeout": timeout}) + "\n")
    z.stdin.flush()
    rc = json.loads(z.stdout.readline())["rc"]
    read = lambda p: p.read_text("utf-8", "replace") if p.exists() else ""  # noqa: E731
    o, e = read(out), read(err)
    for p in (out, err):
        p.unlink(missing_ok=True)
    return rc, o, e


def run_case(case: Case, keep: bool = False, fork: bool = True) -> dict:
    T = Path(tempfile.mkdtemp(prefix="sweep_"))
    try:
        prepare(case, T)
        before = snapshot(T, case.unchanged)
        env = {k: v for k, v in os.environ.items() if k != "TIRX_GEMM_DEBUG"}
        env.update({"PYTHONPATH": str(ROOT)}, **{k: _fill(v, T) for k, v in case.env.items()})
        argv = command(case, T)
        start = time.monotonic()
        if fork and case.kind == "py" and not case.env:
            rc, out, err = _run_forked(argv[2], T, case.timeout)
        else:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            try:
                o, e = proc.communicate(timeout=case.timeout)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                try:  # the whole session: build workers included
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                o, e = proc.communicate()
                rc = None
            out, err = o.decode("utf-8", "replace"), e.decode("utf-8", "replace")
        elapsed = time.monotonic() - start
        after = snapshot(T, case.unchanged)
        changed = [r for r in case.unchanged if before[r] != after[r]]
        created = [r for r in case.absent if os.path.lexists(T / r)]
        outcome, message = classify(case, rc, out, err, changed + created, str(T))
    finally:
        for p in sorted(T.rglob("*"), reverse=True) if T.exists() else ():
            try:
                if p.is_dir() and not p.is_symlink():
                    p.chmod(stat.S_IRWXU)
            except OSError:
                pass
        if not keep:
            shutil.rmtree(T, ignore_errors=True)
    message = message.replace(str(T), "{T}")  # the case's folder: no path of this machine
    return {"id": case.id, "group": case.group, "kind": case.kind, "expect": case.expect,
            "outcome": outcome, "message": message[:600], "rc": rc,
            "elapsed_s": round(elapsed, 2), "card": CARD}


def _message_lines(err: str) -> list[str]:
    """stderr's lines a user reads as the error: without progress lines, argparse's usage
    block, and warnings the harness does not judge here (torch's own)."""
    lines, in_usage = [], False
    for ln in err.strip().splitlines():
        if ln.startswith("usage:"):
            in_usage = True
            continue
        if in_usage and (ln.startswith(" ") or not ln.strip()):
            continue
        in_usage = False
        if PROGRESS.match(ln) or not ln.strip():
            continue
        lines.append(ln)
    return lines


def judge_message(msg: str, needles, T: str) -> tuple[str, str]:
    """("clear" or "unclear", why) for a refusal's text."""
    lines = msg.strip().split("\n")
    if len(lines) == 2 and HINT.match(lines[1]):
        msg = " ".join(lines)  # the refusal, then one line of how to go on: one message
    elif len(lines) > 1:
        return "unclear", "more than one line"
    low = msg.lower()
    missing = [n for n in needles if _fill(n, Path(T)).lower() not in low]
    if missing:
        return "unclear", f"does not name {missing}"
    if not WAY_OUT.search(msg):
        return "unclear", "no way out"
    return "clear", ""


def classify(case: Case, rc, out: str, err: str, changed: list, T: str) -> tuple[str, str]:
    if rc is None:
        if case.expect == "error" and any(PROGRESS.match(ln) for ln in err.splitlines()):
            return "silent", (f"accepted: still building after {case.timeout:.0f} s "
                              f"({err.strip().splitlines()[-1][:160]})")
        return "hang", f"still running after {case.timeout:.0f} s"
    both = out + "\n" + err
    if changed:
        return "silent", f"refused or not, it changed {changed}"
    if case.kind == "py":
        return _classify_py(case, rc, out, err, T)
    if "Traceback (most recent call last)" in both:
        last = [ln for ln in err.strip().splitlines() if ln.strip()]
        return "traceback", (last[-1] if last else "Traceback")
    warns = [ln for ln in err.splitlines() if "warning" in ln.lower()]
    if rc == 0:
        if case.expect == "error":
            return "silent", "exit 0: " + (out.strip().splitlines() or [""])[-1][:200]
        if case.expect == "warn":
            hit = [w for w in warns if all(_fill(n, Path(T)).lower() in w.lower()
                                           for n in case.needles)]
            return ("clear", hit[0]) if hit else ("silent", "exit 0 without a warning")
        return "worked", ""
    if rc < 0:
        return "traceback", f"killed by signal {-rc}"
    lines = _message_lines(err)
    if not lines:
        lines = [ln for ln in out.strip().splitlines() if ln.strip()][-1:]
    if not lines:
        return "unclear", f"exit {rc} with no message"
    text = "\n".join(lines)
    verdict, why = judge_message(text, case.needles, T)
    return verdict, text if not why else f"{why}: {text}"


def _classify_py(case: Case, rc, out: str, err: str, T: str) -> tuple[str, str]:
    done = next((ln for ln in out.splitlines() if ln.startswith("SWEEP-DONE ")), None)
    exc_line = next((ln for ln in err.splitlines() if ln.startswith("SWEEP-EXC ")), None)
    if done is not None:
        info = json.loads(done[len("SWEEP-DONE "):])
        if info["wrong"]:
            return "silent", "wrong: " + "; ".join(info["wrong"])
        warned = info["warnings"]
        if case.expect == "error":
            return "silent", "accepted" + (f" (warned: {warned[0][:200]})" if warned else "")
        if case.expect == "warn":
            hit = [w for w in warned if all(_fill(n, Path(T)).lower() in w.lower()
                                            for n in case.needles)]
            if hit:
                verdict, why = judge_message(hit[0], case.needles, T)
                return verdict, hit[0] if not why else f"{why}: {hit[0]}"
            return "silent", "no warning" + (f" (other: {warned[0][:200]})" if warned else "")
        return "worked", ""
    if exc_line is None:
        if "Traceback (most recent call last)" in err:
            return "traceback", err.strip().splitlines()[-1]
        return "traceback", f"exit {rc} without a result: {err.strip()[-300:]}"
    info = json.loads(exc_line[len("SWEEP-EXC "):])
    kind, msg, last = info["type"], info["msg"], info["last"]
    shown = f"{kind}: {msg}"
    if kind in INTERNAL and last == "<string>":
        return "harness", f"the case's own code failed: {shown}"
    if case.expect == "work" and kind not in INTERNAL and not INTERNAL_MSG.search(msg):
        return "unclear", f"refused a valid input: {shown}"
    if kind in INTERNAL:
        return "traceback", shown
    inside_project = "/tirx_gemm/" in last
    if inside_project and INTERNAL_MSG.search(msg):
        return "traceback", f"Python's own error inside {Path(last).name}: {shown}"
    at_call = last == "<string>"  # raised by Python at the call itself (a bad keyword)
    if at_call and kind == "TypeError" or case.torch_ok and "/torch/" in last:
        # Python's own signature errors, and torch's own errors where torch's layer would
        # raise the same (nn.Linear's conventions): judged on naming the input only
        missing = [n for n in case.needles if _fill(n, Path(T)).lower() not in msg.lower()]
        return ("unclear", f"does not name {missing}: {shown}") if missing else ("clear", shown)
    if not (inside_project or at_call):
        where = "torch" if "/torch/" in last else Path(last).name
        return "traceback", f"raised inside {where}: {shown}"
    if not msg.strip():
        return "unclear", f"{kind} with no message"
    verdict, why = judge_message(msg, case.needles, T)
    return verdict, shown if not why else f"{why}: {shown}"


# --------------------------------------------------------------------------------------
# the sweep
# --------------------------------------------------------------------------------------
def summary(records: list[dict]) -> dict:
    counts = {o: 0 for o in (*OUTCOMES, HARNESS)}
    for r in records:
        counts[r["outcome"]] += 1
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="JSONL file the records are appended to")
    ap.add_argument("--summary", help="JSONL file the run's counts are appended to")
    ap.add_argument("--only", default="", help="run the cases whose id holds this")
    ap.add_argument("--ids", help="a file of case ids, one a line: run those only")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--list", action="store_true", help="list the cases and stop")
    ap.add_argument("--catalogue", default="all", help="'all' or 'core' (no newer parts)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    import catalogue
    cases = catalogue.cases(args.catalogue)
    cases = [c for c in cases if args.only in c.id]
    if args.ids:
        want = set(Path(args.ids).read_text(encoding="utf-8").split())
        cases = [c for c in cases if c.id in want]
    if args.list:
        for c in cases:
            print(c.id, c.group, c.kind, c.expect)
        print(len(cases), "cases")
        return 0
    stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    records = []
    with futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for rec in pool.map(run_case, cases):
            rec["timestamp"] = stamp
            records.append(rec)
            print(f"{rec['outcome']:9} {rec['id']}: {rec['message'][:160]}", flush=True)
            if args.out:
                with open(args.out, "a", encoding="utf-8") as f:
                    f.write(json.dumps(rec) + "\n")
    counts = summary(records)
    line = {"kind": "summary", "catalogue": args.catalogue, "cases": len(records), **counts,
            **({"only": args.only} if args.only else {}), **({"ids": args.ids} if args.ids else {}),
            "timestamp": stamp, "card": CARD, "python": platform.python_version()}
    print(json.dumps(line))
    if args.summary:
        with open(args.summary, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
