"""v12's tile menu builder: keywords that change its pipeline (issue 32), on the CPU."""
import pytest

from tirx_gemm import registry


def test_mma_lag_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    with pytest.raises(ValueError, match="MMA_LAG=4 needs PIPE_DEPTH > 4"):
        step.build_primfunc(64, 256, 512, BLK_M=64, BLK_N=64, PIPE_DEPTH=4, MMA_LAG=4)
    with pytest.raises(ValueError, match="MMA_LAG=0"):
        step.build_primfunc(64, 256, 512, BLK_M=64, BLK_N=64, MMA_LAG=0)


@pytest.mark.parametrize("lag", [1, 3])
def test_mma_lag_sets_the_wait_and_releases_every_stage(lag):
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    text = step.build_primfunc(64, 256, 512, BLK_M=64, BLK_N=64, PIPE_DEPTH=8,
                               MMA_LAG=lag).script()
    # the K loop waits with MMA_LAG groups pending; the tile's end drains to 0
    waits = [ln.strip() for ln in text.splitlines() if "wgmma" in ln and "wait_group" in ln]
    assert waits == [f'T.ptx.wgmma({lag}, "wait_group", "sync", "aligned", "")',
                     'T.ptx.wgmma(0, "wait_group", "sync", "aligned", "")']
