"""Fp8Linear.from_checkpoint's scale kind: read from the scale's shape where it fits one
kind, named by ``scale=`` where it fits two, checked against the shape when named. A (1, N)
scale is per channel and also the 128x128 block shape when N <= 128 and K/128 = N: read as per
channel, a block-scaled weight dequantized to the wrong values without a word. CPU tensors
only."""
import pytest

torch = pytest.importorskip("torch")
from tirx_gemm.op import fp8_nn  # noqa: E402

E4M3 = torch.float8_e4m3fn
N, K = 64, 8192  # (1, N) is both the per-channel and the (ceil(N/128), K/128) block shape


def _weight(n=N, k=K):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, k, generator=g) * 8).to(E4M3)


def _scale():
    return torch.exp2(torch.arange(N, dtype=torch.float32) % 7 - 3).reshape(1, N)


def test_a_scale_shape_that_fits_row_and_block_is_refused_without_scale():
    with pytest.raises(ValueError) as e:
        fp8_nn.Fp8Linear.from_checkpoint(_weight(), _scale())
    msg = str(e.value)
    assert "\n" not in msg and "(1, 64)" in msg and "64x8192" in msg
    assert "'row'" in msg and "'block'" in msg and "scale=" in msg


@pytest.mark.parametrize("scale", ["row", "block"])
def test_a_named_kind_dequantizes_as_that_kind(scale):
    w, s = _weight(), _scale()
    layer = fp8_nn.Fp8Linear.from_checkpoint(w, s, scale=scale)
    assert layer.scale == scale
    if scale == "row":  # scale[0, n] multiplies output channel n
        want = w.float() * s.reshape(N, 1)
    else:  # scale[0, j] multiplies columns 128 j .. 128 j + 127 (one block row: N <= 128)
        want = w.float() * s.reshape(1, N).repeat_interleave(128, dim=1)
    assert torch.equal(layer.dequantized_weight(), want)
    other = w.float() * (s.reshape(1, N).repeat_interleave(128, dim=1) if scale == "row"
                         else s.reshape(N, 1))
    assert not torch.equal(layer.dequantized_weight(), other)  # the two kinds differ here


@pytest.mark.parametrize("scale,shape,kind", [
    ("tensor", (1, N), None),         # per-channel/block shape named per tensor
    ("row", (1, K // 128 + 1), None),  # fits no kind at all
    ("block", (N,), "row"),           # a per-channel shape named block
    ("row", (1, 1), "tensor"),        # a one-element scale named per channel
])
def test_a_named_kind_that_the_shape_does_not_fit_is_refused_in_one_line(scale, shape, kind):
    with pytest.raises(ValueError) as e:
        fp8_nn.Fp8Linear.from_checkpoint(_weight(), torch.ones(shape), scale=scale)
    msg = str(e.value)
    assert "\n" not in msg and f"but a {scale!r} scale of a {N}x{K} weight is" in msg, msg
    if kind:
        assert f"pass scale={kind!r}" in msg, msg
    else:
        assert ("pass scale=" in msg) == (shape == (1, N)), msg


def test_an_unknown_kind_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="scale='channel': an Fp8Linear's scale kind is one of"):
        fp8_nn.Fp8Linear.from_checkpoint(_weight(), torch.ones(N), scale="channel")


def test_shapes_that_fit_one_kind_still_read_it_without_scale():
    w = _weight(256, 384)
    for shape, kind in (((256,), "row"), ((256, 1), "row"), ((1, 256), "row"),
                        ((2, 3), "block"), ((), "tensor"), ((1,), "tensor"), ((1, 1), "tensor")):
        layer = fp8_nn.Fp8Linear.from_checkpoint(w, torch.full(shape, 0.5))
        assert layer.scale == kind, shape
        assert torch.equal(layer.dequantized_weight(), w.float() * 0.5)
        assert fp8_nn.Fp8Linear.from_checkpoint(w, torch.full(shape, 0.5),
                                                scale=kind).scale == kind


def test_a_one_element_scale_is_per_tensor_unless_named_block():
    """(1, 1) is also the block shape of a weight of one 128x128 block: one scale for the
    whole weight either way, so it reads as per tensor, and scale="block" keeps the kind."""
    w = _weight(128, 128)
    assert fp8_nn.Fp8Linear.from_checkpoint(w, torch.full((1, 1), 2.0)).scale == "tensor"
    blk = fp8_nn.Fp8Linear.from_checkpoint(w, torch.full((1, 1), 2.0), scale="block")
    assert blk.scale == "block" and tuple(blk.weight_scale.shape) == (1, 1)
    assert torch.equal(blk.dequantized_weight(), w.float() * 2)


def test_meta_tensors_get_the_same_kind_checks():
    w = torch.empty(N, K, dtype=E4M3, device="meta")
    s = torch.empty(1, N, device="meta")
    with pytest.raises(ValueError, match="fits both 'row' and 'block'"):
        fp8_nn.Fp8Linear.from_checkpoint(w, s)
    layer = fp8_nn.Fp8Linear.from_checkpoint(w, s, scale="block")
    assert layer.scale == "block" and layer.weight_scale.is_meta
