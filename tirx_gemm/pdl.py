"""Programmatic dependent launch (PDL): a kernel that starts before the one ahead of it ends.

Two kernels queued on one stream normally run strictly one after the other: the second
grid is launched only once the first has finished and flushed, so every call pays the
launch latency and its own prologue (shared-memory carve-out, barrier init, descriptor
prefetch) with the GPU idle. With PDL (sm_90 on) the second kernel is launched with
``cudaLaunchAttributeProgrammaticStreamSerialization``: its CTAs may start as soon as the
first grid's CTAs have all exited or executed ``griddepcontrol.launch_dependents``, and
the second kernel itself says where it starts depending on the first one's memory:
``griddepcontrol.wait`` blocks the thread until every prerequisite grid has completed and
its writes are visible. Everything before the wait overlaps the previous kernel's tail.

The contract a kernel keeps here: every thread executes :func:`wait` after its prologue
(barrier init, TMEM/TMA set-up: nothing that reads or writes global memory) and before its
first global access (TMA loads of A and B, stores of D, workspace counters), so no read of
an operand still being written and no write of D still being read can happen. It then
calls :func:`launch_dependents`, letting the next kernel's CTAs launch while this one
works: they can only take an SM this grid has left (a persistent CTA fills one), and they
wait in their own :func:`wait` until this grid is done.

TVM 0.27 sets the launch attribute for a PrimFunc whose ``tirx.kernel_launch_params`` list
``tirx.use_programtic_dependent_launch`` (TVM's spelling; :func:`with_launch`). Its lowering
derives the thread tags of that list (blockIdx, threadIdx, clusterCtaIdx) from the kernel body
and keeps only the launch-mode tags of ours: a CTA pair (``T.cta_id_in_cluster``) keeps its
``clusterCtaIdx.x``/``.y`` tags beside the PDL tag. Its CUDA runtime (``CUDAWrappedFunc`` in
libtvm_runtime_cuda.so) then launches with one ``cuLaunchKernelEx`` whose attributes are the
cluster dimension (when the tags name a cluster) AND programmatic stream serialization (when
the PDL tag is there), so a pair takes PDL too; a builder opts in per kernel shape
(:func:`check`'s ``pairs``) once its wait covers the cluster's set-up. A kernel launched without
the attribute runs its ``griddepcontrol.wait`` as a no-op. v12's pairs ran so on the H200,
every run checked (lab/pdl_exit_trigger/records/v12_pairpdl_h200.jsonl, lab/pdl_exit_trigger/h200_pairpdl.sh).
"""
from __future__ import annotations

PDL_TAG = "tirx.use_programtic_dependent_launch"  # sic: TVM 0.27's attribute name
# what TVM derives for a 1-D grid of one-CTA blocks with dynamic shared memory, and where
# the PDL tag goes in it
LAUNCH_PARAMS = ("blockIdx.x", "threadIdx.x", PDL_TAG, "tirx.use_dyn_shared_memory")
# the same for a 1-D grid of CTA pairs (T.cta_id_in_cluster([2, 1])): TVM's own order, which
# it re-derives from the body whatever the thread tags given here
PAIR_LAUNCH_PARAMS = ("clusterCtaIdx.x", "clusterCtaIdx.y", "blockIdx.x", "threadIdx.x",
                      PDL_TAG, "tirx.use_dyn_shared_memory")


def check(pdl, cluster: int = 1, pairs: bool = False) -> None:
    """One-line refusals: PDL a bool, and no cluster with it unless the builder says its
    clusters (CLUSTER 2 or 4) wait after their cluster-wide set-up (``pairs``; v12 does)."""
    if not isinstance(pdl, bool):
        raise ValueError(f"PDL={pdl!r} must be True or False")
    if pdl and cluster != 1 and not (pairs and cluster in (2, 4)):
        raise ValueError(f"PDL=True with CLUSTER={cluster}: this builder takes programmatic "
                         "dependent launch for one-CTA kernels only; use CLUSTER=1")


def with_launch(func, pdl: bool, cluster: int = 1):
    """``func`` (a PrimFunc of a 1-D grid of one-CTA blocks, or of clusters of ``cluster``
    CTAs, 2 or 4: the same tags, using dynamic shared memory) with the PDL launch attribute
    when ``pdl``; unchanged otherwise."""
    if not pdl:
        return func
    if cluster not in (1, 2, 4):
        raise ValueError(f"cluster={cluster!r}: PDL launch params for 1, 2 or 4 CTAs only")
    params = PAIR_LAUNCH_PARAMS if cluster > 1 else LAUNCH_PARAMS
    return func.with_attr("tirx.kernel_launch_params", list(params))


def wait():
    """griddepcontrol.wait: this thread waits until the grids it depends on are complete
    and their memory visible. Called in a kernel body (emits the instruction)."""
    from tvm.script import tirx as T
    T.evaluate(T.ptx.griddepcontrol.wait())


def launch_dependents():
    """griddepcontrol.launch_dependents: the next PDL kernel on the stream may launch once
    every CTA of this grid has called it (or exited). Called in a kernel body."""
    from tvm.script import tirx as T
    T.evaluate(T.ptx.griddepcontrol.launch_dependents())
