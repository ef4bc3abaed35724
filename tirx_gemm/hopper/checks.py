"""Build-time checks of an sm_90a configuration: CTAs per SM, the ring's depth, the register split, the cluster pool."""

from __future__ import annotations

from .cluster import CLUSTER_SIZE
from .wgmma import SMEM_PER_SM_BYTES, SMEM_RESERVED_PER_CTA

def check_ctas_fit_sm(ctas_per_sm: int, smem_bytes_per_cta: int) -> None:
    """A persistent pool of ctas_per_sm CTAs per SM must be resident at once, or the CTAs
    beyond the first wave only start when others have finished all their tiles."""
    need = ctas_per_sm * (smem_bytes_per_cta + SMEM_RESERVED_PER_CTA)
    if need > SMEM_PER_SM_BYTES:
        raise ValueError(
            f"CTAS_PER_SM={ctas_per_sm} CTAs of {smem_bytes_per_cta} B shared memory each "
            f"need {need} B, more than the {SMEM_PER_SM_BYTES} B of one sm_90a SM")


def check_ring_for_wait_one(PIPE_DEPTH: int) -> None:
    """A ring whose consumers keep one K slice's wgmmas in flight (``wait_group 1``) hands a
    stage back one K step late, so it needs a second stage to load into meanwhile: with a
    single stage the consumer waits for a load that waits for the consumer (measured on the
    H200: v9 at 300x264x200 with PIPE_DEPTH=1 hung until the host's guard stopped it)."""
    if isinstance(PIPE_DEPTH, int) and not isinstance(PIPE_DEPTH, bool) and PIPE_DEPTH == 1:
        raise ValueError("PIPE_DEPTH=1 cannot work here: the consumers keep one K slice's "
                         "wgmmas in flight (wait_group 1) and free its stage one K step "
                         "late, so a one-stage ring waits on itself; use PIPE_DEPTH >= 2")


def check_cluster_pool(SM_COUNT: int, size: int = CLUSTER_SIZE) -> None:
    """The persistent pool of a clustered step is made of whole clusters of ``size``."""
    if SM_COUNT % size != 0:
        raise ValueError(f"SM_COUNT={SM_COUNT} is not a multiple of the cluster size "
                         f"{size}: the persistent pool is made of whole clusters")


def check_reg_split(producer_regs: int, consumer_regs: int, num_consumers: int) -> None:
    """A setmaxnreg split: multiples of 8 in [24, 256] (PTX's rule) whose total over one
    producer and ``num_consumers`` consumer warpgroups fits the SM's 64K registers."""
    for name, regs in (("PRODUCER_REGS", producer_regs), ("CONSUMER_REGS", consumer_regs)):
        if isinstance(regs, bool) or not isinstance(regs, int) or not 24 <= regs <= 256 \
                or regs % 8:
            raise ValueError(f"{name}={regs!r} must be a multiple of 8 in [24, 256] "
                             f"(setmaxnreg's rule)")
    total = 128 * (producer_regs + num_consumers * consumer_regs)
    if total > 65536:
        raise ValueError(f"PRODUCER_REGS={producer_regs} + {num_consumers} x CONSUMER_REGS="
                         f"{consumer_regs} needs {total} registers per CTA, more than the "
                         f"SM's 65536")
