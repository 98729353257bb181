"""Int4 weight-only linear: fused CPU kernel and tiled fallback match a dequantised reference,
and the forward never materialises a whole float weight."""

from __future__ import annotations

import copy
import gc

import pytest
import torch
from torch import nn

import memwarden
from memwarden.models import zoo
from memwarden.runtime.quant import Int4Linear, pack_block_rows, quantize
from memwarden.trace.model import Action


def reference_model(qmodel: nn.Module) -> nn.Module:
    """The same model with every Int4Linear replaced by a float Linear holding its dequantised weight."""
    ref = copy.deepcopy(qmodel)
    for _path, module in list(ref.named_modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, Int4Linear):
                lin = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None)
                lin.weight.data = child.dequantized_weight()
                if child.bias is not None:
                    lin.bias.data = child.bias.data.clone()
                setattr(module, name, lin)
    return ref


@pytest.mark.parametrize("fused", [True, False])
def test_logits_match_dequantised_reference(fused: bool) -> None:
    model = zoo.build_model("llava", size="tiny")
    inputs = zoo.make_inputs(model, prompt_tokens=12)
    quantize(model, bits=4, group_size=32, fused=fused, tile_rows=16)
    n_int4 = sum(isinstance(m, Int4Linear) for m in model.modules())
    assert n_int4 > 10
    ref = reference_model(model)
    with torch.inference_mode():
        got = model(**inputs).logits
        want = ref(**inputs).logits
    rel = (got - want).abs().max() / want.abs().max()
    assert rel < 1e-3, rel


def test_tiled_forward_never_makes_a_whole_float_weight() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(256, 512)
    q = Int4Linear(lin, group_size=128, tile_rows=64, fused=False)
    x = torch.randn(4, 256)
    with memwarden.capture() as cap, torch.inference_mode():
        q(x)
    e = cap.trace.events
    biggest = int(e["nbytes"][e["action"] == Action.ALLOC].max())
    assert biggest < 512 * 256 * 4 // 4  # a 64-row tile, not the 512-row weight
    assert torch.allclose(q(x), x @ q.dequantized_weight().t() + lin.bias, atol=1e-5)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        quantize(nn.Linear(64, 64), bits=8)
    with pytest.raises(ValueError):
        Int4Linear(nn.Linear(60, 8), group_size=32)


@pytest.mark.parametrize(("n", "k"), [(256, 512), (320, 384), (112, 256), (100, 256)])
def test_the_weight_is_stored_once(n: int, k: int) -> None:
    """Where the fused kernel's packed weight is kept, the tiled path unpacks it instead of holding a
    second copy of the codes: the int4 layer holds N*K/2 bytes of codes plus its scales and zeros,
    and the prefill (tiled) and decode (fused) paths agree with the unfused layer."""
    torch.manual_seed(0)
    lin = nn.Linear(k, n)
    layer, unfused = Int4Linear(lin, 128), Int4Linear(lin, 128, fused=False)
    held = sum(b.numel() * b.element_size() for b in layer.buffers())
    one_copy = sum(b.numel() * b.element_size() for b in unfused.buffers())
    block = pack_block_rows()
    if layer.fused and block is not None and n % block == 0:
        assert layer.codes is None and held == one_copy == n * k // 2 + 2 * 4 * n * k // 128
    x = torch.randn(3, 24, k)
    torch.testing.assert_close(layer(x), unfused(x))
    torch.testing.assert_close(layer(x[:, :1]), unfused(x[:, :1]), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(layer.dequantized_weight(), unfused.dequantized_weight())


def test_quantize_frees_each_float_weight_as_it_goes() -> None:
    """quantize() replaces layers by name, so each float weight is freed as its int4 layer is made:
    the peak stays near the float model plus one layer's temporaries. Holding the modules (what a
    list of them inside quantize did) keeps every float weight alive next to every int4 layer."""
    from memwarden.analyze.timeline import summary
    from memwarden.record.live.capture import Capture

    def peak(hold: bool) -> tuple[int, int, int]:
        # The capture counts every live tensor of the process (other tests' too): compare two runs.
        gc.collect()
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(512, 512, bias=False) for _ in range(32)])
        float_bytes = sum(p.numel() * 4 for p in model.parameters())
        held = list(model.modules()) if hold else None
        with Capture() as cap:
            quantize(model)
        int4_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
        del held
        return summary(cap.trace).peak_bytes, float_bytes, int4_bytes

    got, float_bytes, int4_bytes = peak(hold=False)
    held, _, _ = peak(hold=True)
    assert held >= float_bytes + int4_bytes  # holding the modules: float and int4 weights at once
    assert held - got >= int4_bytes // 2, (held, got, int4_bytes)  # by name: each float freed as it goes
