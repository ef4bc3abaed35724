"""The one device probe: which GPU is this, and can it run a step built for an arch.

Compute capability, SM count, L2 size and (from nvidia-smi) clocks and driver version.
:func:`gpu_arch` answers "which registered arch is this GPU" for the CLI, the notebooks and
scripts/gpu_verify.sh (``python -m tirx_gemm.run.device`` prints it). Imports torch, never TVM.
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from tirx_gemm.run.errors import DeviceMismatchError

__all__ = [
    "ARCH_CAPABILITY",
    "DeviceMismatchError",
    "required_capability_text",
    "capability_matches",
    "cuda_unavailable_reason",
    "resolve_device",
    "check_capability",
    "parse_smi_line",
    "query_nvidia_smi",
    "check_device",
    "device_or_reason",
    "gpu_arch",
    "l2_bytes",
]

# sm_90a kernels use wgmma/setmaxnreg, which exist on compute capability 9.0 only (the "a"
# suffix means arch-specific, not forward compatible). sm_100a (tcgen05, TMEM) needs a 10.x GPU.
# (major, minor); minor None = any minor.
ARCH_CAPABILITY: dict[str, tuple[int, int | None]] = {"sm_90a": (9, 0), "sm_100a": (10, None)}

H200_L2_BYTES = 50 * 1024 * 1024  # fallback when torch does not report the L2 size


def required_capability_text(arch: str) -> str:
    if arch not in ARCH_CAPABILITY:
        raise ValueError(f"unknown arch {arch!r}: expected one of {sorted(ARCH_CAPABILITY)}")
    major, minor = ARCH_CAPABILITY[arch]
    return f"{major}.{'x' if minor is None else minor}"


def capability_matches(arch: str, capability: tuple[int, int]) -> bool:
    """True when a GPU of compute capability ``capability`` can run code built for ``arch``."""
    if arch not in ARCH_CAPABILITY:
        raise ValueError(f"unknown arch {arch!r}: expected one of {sorted(ARCH_CAPABILITY)}")
    major, minor = ARCH_CAPABILITY[arch]
    return capability[0] == major and (minor is None or capability[1] == minor)


def cuda_unavailable_reason() -> str:
    built = torch.version.cuda
    if built is None:
        return f"torch {torch.__version__} is a CPU-only build"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (f"torch {torch.__version__} (CUDA {built}) reports torch.cuda.is_available() == "
            f"False (no driver or no device; CUDA_VISIBLE_DEVICES={visible!r})")


def resolve_device(device) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    dev = torch.device(device)
    if dev.type != "cuda":
        raise DeviceMismatchError(f"device {dev} is not a CUDA device")
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def check_capability(arch: str, device=None) -> torch.device:
    """Cheap part of check_device (no nvidia-smi): raises DeviceMismatchError."""
    need = required_capability_text(arch)
    if not torch.cuda.is_available():
        raise DeviceMismatchError(
            f"no CUDA GPU visible: {cuda_unavailable_reason()}; "
            f"the step built for {arch} needs a GPU of compute capability {need}"
        )
    dev = resolve_device(device)
    cap = tuple(torch.cuda.get_device_capability(dev))
    if not capability_matches(arch, cap):
        name = torch.cuda.get_device_name(dev)
        raise DeviceMismatchError(
            f"step built for {arch} needs compute capability {need}; "
            f"this GPU {name} is {cap[0]}.{cap[1]}"
        )
    return dev


def _smi_value(text: str):
    text = text.strip()
    if not text or text.startswith("[") or text.lower() in ("n/a", "not supported"):
        return None
    try:
        return int(float(text))
    except ValueError:
        return text


def parse_smi_line(line: str) -> dict:
    """Parse one line of ``nvidia-smi --query-gpu=clocks.sm,clocks.mem,clocks.max.sm,
    driver_version --format=csv,noheader,nounits``."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < 4:
        raise ValueError(f"unexpected nvidia-smi line {line!r}")
    sm, mem, max_sm = (_smi_value(p) for p in parts[:3])
    clocks = {"sm_mhz": sm, "mem_mhz": mem, "max_sm_mhz": max_sm}
    if all(v is None for v in clocks.values()):
        clocks = None
    driver = parts[3] if _smi_value(parts[3]) is not None else None
    return {"clocks": clocks, "driver_version": driver}


def query_nvidia_smi(props, index: int, timeout: float = 5.0) -> dict:
    """Clocks (MHz) and driver version of this GPU from nvidia-smi; Nones if unreadable."""
    empty = {"clocks": None, "driver_version": None}
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        uuid = str(uuid)
        sel = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    elif "CUDA_VISIBLE_DEVICES" not in os.environ:
        sel = str(index)  # torch index == nvidia-smi index only without remapping
    else:
        return empty
    cmd = ["nvidia-smi", f"--id={sel}",
           "--query-gpu=clocks.sm,clocks.mem,clocks.max.sm,driver_version",
           "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return empty
    if out.returncode != 0 or not out.stdout.strip():
        return empty
    try:
        return parse_smi_line(out.stdout.strip().splitlines()[0])
    except ValueError:
        return empty


def check_device(arch: str, device=None, *, query_smi: bool = True) -> dict:
    """Check that the visible GPU can run a step built for ``arch``; describe it.

    Raises DeviceMismatchError when no CUDA GPU is visible or the compute capability does not
    fit (sm_90a: exactly 9.0, sm_100a: 10.x). Returns a dict: name, capability "9.0",
    sm_count, l2_bytes, total_memory_bytes, clocks ({sm_mhz, mem_mhz, max_sm_mhz} or None),
    driver_version (or None), cuda_runtime (torch's CUDA version), index.
    """
    dev = check_capability(arch, device)
    props = torch.cuda.get_device_properties(dev)
    cap = torch.cuda.get_device_capability(dev)
    info = {
        "name": props.name,
        "capability": f"{cap[0]}.{cap[1]}",
        "sm_count": int(props.multi_processor_count),
        "l2_bytes": int(getattr(props, "L2_cache_size", 0)) or None,
        "total_memory_bytes": int(props.total_memory),
        "cuda_runtime": torch.version.cuda,
        "index": dev.index,
        "clocks": None,
        "driver_version": None,
    }
    if query_smi:
        info.update(query_nvidia_smi(props, dev.index))
    return info



def device_or_reason(arch: str, *, query_smi: bool = True) -> tuple[dict | None, str | None]:
    """(check_device's description, None) when the GPU here runs ``arch``, else (None, why)."""
    try:
        return check_device(arch, query_smi=query_smi), None
    except DeviceMismatchError as exc:
        return None, str(exc)


def gpu_arch() -> tuple[str | None, str]:
    """The arch whose steps the visible GPU runs ("sm_90a", "sm_100a"), or None and why."""
    if not torch.cuda.is_available():
        return None, f"no CUDA GPU visible: {cuda_unavailable_reason()}"
    cap = tuple(torch.cuda.get_device_capability())
    for arch in ARCH_CAPABILITY:
        if capability_matches(arch, cap):
            return arch, ""
    need = " or ".join(f"{required_capability_text(a)} ({a})" for a in ARCH_CAPABILITY)
    return None, (f"this GPU ({torch.cuda.get_device_name()}) is compute capability "
                  f"{cap[0]}.{cap[1]}; the steps need {need}")


def l2_bytes(device=None) -> int:
    """L2 size of the GPU in bytes (H200_L2_BYTES when torch does not report it)."""
    try:
        props = torch.cuda.get_device_properties(resolve_device(device))
        l2 = int(getattr(props, "L2_cache_size", 0))
        if l2 > 0:
            return l2
    except Exception:
        pass
    return H200_L2_BYTES


def main() -> int:
    """``python -m tirx_gemm.run.device``: print this GPU's arch (exit 0), or why none (exit 2)."""
    arch, why = gpu_arch()
    if arch is None:
        print(why, file=sys.stderr)
        return 2
    print(arch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
