"""The static facts of the project, once: what every layer reads and none copies.

No TVM, no torch, no numpy: builders, the registry, matmul, the run side, the simulator,
records, scripts and tests all import these names instead of writing the values again
(before, adding a dtype touched ten files). A value here is a fact about the project or
the hardware it targets, not a tunable; each says where it comes from.
"""

from __future__ import annotations

# the two tracks: Blackwell (tcgen05, TMEM; executed on NumSim) and Hopper (wgmma; the H200)
ARCHES = ("sm_100a", "sm_90a")

# operand dtypes of the 16-bit steps (v1-v12), and the output dtype of a build that names
# none: float16 is every builder's default and the dtype of every record written before
# bfloat16 existed
DTYPES = ("float16", "bfloat16")
DEFAULT_DTYPE = "float16"

# bytes per element of every dtype a kernel's operand or output may have (fp32: split-K
# partial sums and the fp32 epilogue output; e4m3: v13's operands, passed as uint8 bytes)
ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float8_e4m3fn": 1, "uint8": 1}

# opt-in dynamic shared memory per CTA on sm_90 / sm_100 (the CUDA programming guide's
# compute-capability table: 227 KiB), and what a ring of operand stages may take of it
# (barriers and alignment: helpers.check_pipe_depth keeps 1 KiB for them)
SMEM_BYTES_MAX = 227 * 1024
SMEM_RESERVED_BYTES = 1024


def ring_stages(stage_bytes: int, other_bytes: int = 0) -> int:
    """How many operand stages of ``stage_bytes`` fit a CTA's shared memory beside
    ``other_bytes`` (epilogue staging) and the reserved bytes: the builders' default ring
    depth before their caps, and the chooser's view of it."""
    return (SMEM_BYTES_MAX - SMEM_RESERVED_BYTES - other_bytes) // stage_bytes

# SMs of the GPU each arch's persistent builders size their CTA pool for by default (the
# builders' SM_COUNT keyword): a B200 has 148, an H100 or H200 SXM 132 (the H200 this
# project measures on reports 132)
SM_COUNT = {"sm_100a": 148, "sm_90a": 132}

# CTAs per cluster of the clustered steps (sm_100a v8, v9, v10, v13: the CTA pair of
# cta_group::2 MMAs; sm_90a v8, v9, v10: two vertically adjacent CTAs sharing a multicast B
# tile): the persistent pool (SM_COUNT) must be a multiple of it. A step's own cluster size
# is its registry entry's ``cluster`` (1 for the others)
CLUSTER_SIZE = 2

# TMA's rule for a global tensor: every stride but the innermost is a multiple of 16 bytes,
# so a row of A, B or D must hold a multiple of 16 / element-bytes elements (8 of fp16 or
# bf16, 16 of e4m3); tensors start 16-byte aligned
TMA_ROW_BYTES = 16


def row_multiple(dtype: str) -> int:
    """The multiple a row's length (in elements of ``dtype``) must be for TMA."""
    return TMA_ROW_BYTES // element_bytes(dtype)


# where runs record what they measured (relative to the checkout): results/<kind>/*.jsonl
RESULTS_DIR = "results"


def element_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype``; a one-line error naming the known ones."""
    try:
        return ELEMENT_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}: one of {', '.join(ELEMENT_BYTES)}") from None


def sm_count(arch: str) -> int:
    """The default SM count of ``arch``'s persistent builders."""
    try:
        return SM_COUNT[arch]
    except KeyError:
        raise ValueError(f"unknown arch {arch!r}: one of {', '.join(ARCHES)}") from None
