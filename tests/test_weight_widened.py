"""A half-precision model cast wider once and kept so (dequant-temporaries, the kept case).

``model.to(pixel_values.dtype)`` to reconcile float32 pixels with a bfloat16 checkpoint doubles
every weight for the rest of the run; casting the inputs to the model's dtype keeps the model as
shipped. Real captures of a tiny LLaVA (random weights) built in bfloat16.
"""

from __future__ import annotations

import torch

import memwarden
from memwarden.analyze.diagnose import diagnose
from memwarden.models import zoo
from memwarden.trace.model import Trace

MiB = 1 << 20


def _run(widen: bool, train: bool = False) -> tuple[Trace, int, int]:
    """Build in bfloat16, then either cast the model to the pixels' float32 (``widen``) or the
    pixels to the model's bfloat16; one generate (or, ``train``, one training step)."""
    with memwarden.capture() as cap:
        model = zoo.build_model("llava", dtype=torch.bfloat16)
        half_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        inputs = zoo.make_inputs(model, prompt_tokens=12)
        pixels = inputs["pixel_values"].float()
        if widen:
            model.to(pixels.dtype)
        else:
            pixels = pixels.to(model.dtype)
        inputs["pixel_values"] = pixels
        if train:
            model.train()
            out = model(**inputs, labels=inputs["input_ids"])
            out.loss.backward()
        else:
            with torch.no_grad():
                model.generate(**inputs, max_new_tokens=3, **zoo.generate_kwargs("llava"))
        wide_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert cap.trace is not None
    return cap.trace, half_bytes, wide_bytes


def _widened(trace: Trace) -> list:
    return [f for f in diagnose(trace) if f.pattern == "dequant-temporaries"]


def test_a_bf16_model_cast_to_the_inputs_float32_is_named_with_the_weights_it_doubles() -> None:
    trace, half_bytes, wide_bytes = _run(widen=True)
    assert wide_bytes == 2 * half_bytes
    (f,) = _widened(trace)
    assert (f.evidence["from_dtype"], f.evidence["to_dtype"]) == ("bfloat16", "float32")
    # the weights kept wide at the peak, at half their size (and the activations computed in float32)
    assert f.saving_peak_bytes >= 0.8 * half_bytes
    assert f.severity in ("high", "medium") and "model.dtype" in f.fix
    assert f.lines and f.lines[0]["file"].endswith("test_weight_widened.py")
    fixed, _, _ = _run(widen=False)
    assert _widened(fixed) == []
    measured = memwarden.summary(trace).peak_bytes - memwarden.summary(fixed).peak_bytes
    assert abs(f.saving_peak_bytes - measured) <= max(0.1 * measured, MiB), (f.saving_peak_bytes, measured)


def test_float32_master_weights_for_training_are_a_choice() -> None:
    trace, _, _ = _run(widen=True, train=True)
    assert _widened(trace) == []
