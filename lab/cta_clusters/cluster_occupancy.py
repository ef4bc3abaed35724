"""How many clusters of a v12 kernel the GPU holds at once (the driver's own count).

A cluster's CTAs must all sit in one GPC, so a grid of clusters of 4 fills fewer SMs than
a grid of single CTAs can: what is left of a GPC after its whole clusters stays idle, and
a persistent grid of SM_COUNT / 4 clusters may not be resident in one wave at all. The
driver answers that per kernel and launch configuration
(``cuOccupancyMaxActiveClusters``); this script asks it for v12 kernels (one CTA per SM:
their ring takes the shared memory) at cluster sizes 1, 2, 4 and 8:

    python lab/cta_clusters/cluster_occupancy.py export --out .gpu/occ              # here
    python lab/cta_clusters/cluster_occupancy.py run .gpu/occ \\
        --records lab/cta_clusters/records/cluster_occupancy_h200.jsonl                     # GPU host

``export`` builds the kernels (tirx_gemm.compile.api) and copies each cubin with its
shared-memory size and thread count; ``run`` needs only the CUDA driver (and torch, to
make the context).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import re
import shutil
import sys
from pathlib import Path

# (M, N, K, keywords): one kernel per CTA shape (256 threads: BLK_M 64; 384: BLK_M 128)
KERNELS = (
    (72, 4608, 4096, {"BLK_M": 64, "BLK_N": 72, "SWAP_AB": True, "CLUSTER": 4, "PDL": True}),
    (72, 10240, 8192, {"BLK_M": 128, "BLK_N": 72, "SWAP_AB": True, "CLUSTER": 4,
                       "PDL": True, "PDL_TRIGGER": "exit"}),
)
SIZES = (1, 2, 4, 8)
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4


def export(out: Path) -> int:
    from tirx_gemm.compile import api
    out.mkdir(parents=True, exist_ok=True)
    for M, N, K, kw in KERNELS:
        res = api.build("v12", M, N, K, arch="sm_90a", dtype="bfloat16", SM_COUNT=132,
                        RUNTIME_M=True, **kw)
        src = Path(res.dir)
        threads = int(re.search(r"__launch_bounds__\((\d+)\)",
                                (src / "kernel.cu").read_text()).group(1))
        name = f"v12_{M}x{N}x{K}_{kw['BLK_M']}x{kw['BLK_N']}c{kw['CLUSTER']}"
        shutil.copy(src / "kernel.cubin", out / f"{name}.cubin")
        (out / f"{name}.json").write_text(json.dumps(
            {"M": M, "N": N, "K": K, "kwargs": kw, "threads": threads,
             "smem_bytes": res.smem_bytes, "function": "kernel_kernel"}))
        print(f"exported {name}: {threads} threads, {res.smem_bytes} B shared")
    return 0


class _Dim(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class _AttrValue(ctypes.Union):
    _fields_ = [("clusterDim", _Dim), ("pad", ctypes.c_char * 64)]


class _Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttrValue)]


class _Config(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attr)), ("numAttrs", ctypes.c_uint)]


def _check(cu, rc, what):
    if rc != 0:
        msg = ctypes.c_char_p()
        cu.cuGetErrorString(rc, ctypes.byref(msg))
        raise RuntimeError(f"{what}: CUDA driver error {rc} ({(msg.value or b'').decode()})")


def run(folder: Path, records: Path) -> int:
    import torch
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # a current context
    cu = ctypes.CDLL("libcuda.so.1")
    device = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for meta_path in sorted(folder.glob("*.json")):
        meta = json.loads(meta_path.read_text())
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        _check(cu, cu.cuModuleLoad(ctypes.byref(mod),
                                   str(meta_path.with_suffix(".cubin")).encode()), "load")
        _check(cu, cu.cuModuleGetFunction(ctypes.byref(fn), mod,
                                          meta["function"].encode()), "function")
        _check(cu, cu.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                         meta["smem_bytes"]), "smem attribute")
        for size in SIZES:
            attr = _Attr(id=CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
            attr.value.clusterDim = _Dim(size, 1, 1)
            cfg = _Config(gridDimX=sms - sms % size, gridDimY=1, gridDimZ=1,
                          blockDimX=meta["threads"], blockDimY=1, blockDimZ=1,
                          sharedMemBytes=meta["smem_bytes"], hStream=None,
                          attrs=ctypes.pointer(attr), numAttrs=1)
            n = ctypes.c_int()
            _check(cu, cu.cuOccupancyMaxActiveClusters(ctypes.byref(n), fn,
                                                       ctypes.byref(cfg)), "occupancy")
            row = {"kernel": meta_path.stem, "threads": meta["threads"],
                   "smem_bytes": meta["smem_bytes"], "cluster": size,
                   "max_active_clusters": n.value, "ctas": n.value * size, "sms": sms,
                   "device": device, "torch": torch.__version__}
            rows.append(row)
            print(f"{meta_path.stem}: clusters of {size}: {n.value} at once "
                  f"({n.value * size} of {sms} SMs)")
    records.parent.mkdir(parents=True, exist_ok=True)
    with records.open("a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("run")
    r.add_argument("folder", type=Path)
    r.add_argument("--records", type=Path, required=True)
    a = ap.parse_args(argv)
    return export(a.out) if a.cmd == "export" else run(a.folder, a.records)


if __name__ == "__main__":
    sys.exit(main())
