"""Every builder rejects invalid arguments with a ValueError naming the broken constraint,
before any compilation happens."""
import pytest

from tirx_gemm import registry

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CONSTRAINT_WORDS = ("multiple of", "must equal", "K_TILES", "must be")


@pytest.mark.parametrize("step", registry.STEPS, ids=lambda s: s.key)
def test_invalid_shapes_raise_with_constraint(step):
    assert step.invalid_shapes, "each step lists shapes it must reject"
    for M, N, K in step.invalid_shapes:
        with pytest.raises(ValueError) as info:
            step.build_primfunc(M, N, K)
        msg = str(info.value)
        assert any(w in msg for w in CONSTRAINT_WORDS), msg
        assert any(f"{n}=" in msg for n in ("M", "N", "K", "K_TILES")), msg


@pytest.mark.parametrize("step", registry.STEPS, ids=lambda s: s.key)
def test_invalid_shapes_raise_in_bfloat16_too(step):
    """The shape contract does not depend on the dtype (both are 2 bytes)."""
    for M, N, K in step.invalid_shapes:
        with pytest.raises(ValueError) as info:
            step.build_primfunc(M, N, K, dtype="bfloat16")
        assert any(w in str(info.value) for w in CONSTRAINT_WORDS), str(info.value)


@pytest.mark.parametrize("step", registry.STEPS, ids=lambda s: s.key)
def test_bad_dtype_and_types_raise(step):
    M, N, K = step.canonical
    with pytest.raises(ValueError, match="dtype='float32' is not supported"):
        step.build_primfunc(M, N, K, dtype="float32")
    with pytest.raises(ValueError, match="must be a Python int"):
        step.build_primfunc(float(M), N, K)
    with pytest.raises(ValueError, match="must be positive"):
        step.build_primfunc(M, N, 0)


def test_messages_name_the_tile():
    with pytest.raises(ValueError, match=r"K=96 is not a multiple of BLK_K=64"):
        registry.get("v3", "sm_100a").build_primfunc(128, 128, 96)
    with pytest.raises(ValueError, match=r"M=256 must equal 128"):
        registry.get("v1", "sm_100a").build_primfunc(256, 128, 64)
    with pytest.raises(ValueError, match=r"PIPE_DEPTH=9 needs ~\d+ KiB of shared memory"):
        registry.get("v6", "sm_100a").build_primfunc(128, 128, 192, PIPE_DEPTH=9)


@pytest.mark.parametrize("sid", ["v7", "v8", "v9"])
def test_sm90a_one_stage_ring_is_refused(sid):
    # the consumers keep one slice's wgmmas in flight (wait_group 1): a one-stage ring
    # deadlocks (it hung on the H200), so the builder refuses it before building
    with pytest.raises(ValueError, match="PIPE_DEPTH=1 cannot work here"):
        registry.get(sid, "sm_90a").build_primfunc(4096, 4096, 4096, PIPE_DEPTH=1)
