"""The registry is the single table of steps: check it is complete and consistent."""
import inspect

import pytest

from tirx_gemm import registry


def test_keys_unique_and_steps_in_order():
    # in increasing order on each track, and both tracks have the same steps; a number may
    # be skipped (v11, split-K, came before v10)
    keys = [s.key for s in registry.STEPS]
    assert len(keys) == len(set(keys))
    tracks = {arch: [s.id for s in registry.all_steps(arch)] for arch in registry.ARCHES}
    for arch, ids in tracks.items():
        nums = [int(i[1:]) for i in ids]
        assert nums == sorted(set(nums)) and nums[:9] == list(range(1, 10)), (arch, ids)
    # a step on one track only says why (registry.Step.one_track); the others are twins
    for s in registry.STEPS:
        if s.one_track is not None:
            assert len(s.one_track) > 30, s.key
    twins = {arch: [s.id for s in registry.all_steps(arch) if s.one_track is None]
             for arch in registry.ARCHES}
    assert len({tuple(ids) for ids in twins.values()}) == 1, twins


def test_both_tracks_have_the_tutorials_seven_steps_at_least():
    for arch in registry.ARCHES:
        ids = [s.id for s in registry.all_steps(arch)]
        assert ids[:7] == [f"v{i}" for i in range(1, 8)], (arch, ids)


@pytest.mark.parametrize("step", registry.STEPS, ids=lambda s: s.key)
def test_builder_importable_with_documented_signature(step):
    fn = step.builder()
    assert fn.__name__ == f"hgemm_{step.id}"
    params = list(inspect.signature(fn).parameters)
    assert params[:3] == ["M", "N", "K"] and "dtype" in params
    assert fn.__doc__ and len(fn.__doc__.strip()) > 100, "each builder carries a step card"
    assert step.lesson and step.constraints and step.sass_expect
    if step.sm_count_kwarg:  # persistent steps size their CTA pool to the GPU
        assert step.sm_count_kwarg in params


def test_get_errors_are_clear():
    with pytest.raises(ValueError, match="unknown arch"):
        registry.get("v1", "sm_80")
    with pytest.raises(ValueError, match="no step 'v99'"):
        registry.get("v99", "sm_100a")
    assert registry.get("4", "sm_100a").id == "v4"
