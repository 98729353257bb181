"""Storages PyTorch's CPU allocator did not make are in the trace (``memwarden.record.foreign``).

numpy arrays (``torch.from_numpy``, a processor's ``pixel_values``), Python buffers
(``torch.frombuffer``), DLPack capsules and checkpoints memory-mapped by ``from_pretrained`` wrap
memory the native recorder never sees. Each test feeds such a tensor to a real model inside a
capture and finds it in the trace with its size, category, modality and release.
"""

from __future__ import annotations

import gc
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import CLIPImageProcessor, LlamaConfig, LlamaForCausalLM

import memwarden
from memwarden.models import zoo
from memwarden.record.foreign import EXTERNAL_OP, is_foreign
from memwarden.trace.model import Action, Category, Modality, Trace


def _tiny_llama(dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=500,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM._from_config(config, dtype=dtype).eval()


def _external_rows(trace: Trace, op: str = EXTERNAL_OP) -> list[dict[str, Any]]:
    ev = trace.events
    rows = np.flatnonzero(ev["op"] == trace.strings.index(op)) if op in trace.strings else []
    return [
        {
            "action": Action(int(ev["action"][i])),
            "nbytes": int(ev["nbytes"][i]),
            "tensor": int(ev["tensor"][i]),
            "category": Category(int(ev["category"][i])),
            "modality": Modality(int(ev["modality"][i])),
        }
        for i in rows
    ]


def _ids_from_numpy(tokens: int) -> torch.Tensor:
    return torch.from_numpy(np.arange(3, 3 + tokens, dtype=np.int64).reshape(1, tokens) % 400)


def _ids_from_buffer(tokens: int) -> torch.Tensor:
    data = bytearray((np.arange(3, 3 + tokens, dtype=np.int64) % 400).tobytes())
    return torch.frombuffer(data, dtype=torch.int64).reshape(1, tokens)


def _ids_from_dlpack(tokens: int) -> torch.Tensor:
    return torch.from_dlpack(np.arange(3, 3 + tokens, dtype=np.int64).reshape(1, tokens) % 400)


@pytest.mark.parametrize(
    "make", [_ids_from_numpy, _ids_from_buffer, _ids_from_dlpack], ids=["numpy", "frombuffer", "dlpack"]
)
def test_input_wrapping_foreign_memory_is_an_input_with_its_release(make: Any) -> None:
    model = _tiny_llama()
    tokens = 300
    with memwarden.capture() as cap, torch.no_grad():
        ids = make(tokens)
        assert is_foreign(ids)
        model(ids)  # positional: read as input_ids, a text input
        del ids
        gc.collect()
        model(torch.ones(1, 4, dtype=torch.long))  # an allocator-made input adds no external row
    rows = _external_rows(cap.trace)
    assert [(r["action"], r["nbytes"], r["category"], r["modality"]) for r in rows] == [
        (Action.ALLOC, tokens * 8, Category.INPUT, Modality.TEXT),
        (Action.FREE, tokens * 8, Category.INPUT, Modality.TEXT),
    ]
    assert rows[0]["tensor"] == rows[1]["tensor"] < 0  # one storage, apart from the allocator's block ids


def test_processor_pixel_values_from_numpy_are_a_vision_input() -> None:
    """A real transformers image processor builds ``pixel_values`` in numpy; a tiny LLaVA reads them.
    Made during the capture, they are numpy's own block (the capture is numpy's data-memory
    handler), not a foreign storage too; smaller numpy data stays foreign (the test above)."""
    model = zoo.build_model("llava", size="tiny")
    inputs = zoo.make_inputs(model, prompt_tokens=4)
    side = model.config.vision_config.image_size
    processor = CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8))
    with memwarden.capture() as cap, torch.no_grad():
        pixel_values = processor(images=image, return_tensors="pt")["pixel_values"]  # (1, 3, side, side)
        assert is_foreign(pixel_values)
        model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], pixel_values=pixel_values)
    assert cap.trace.metadata["numpy_recorded"] is True
    assert _external_rows(cap.trace) == []
    pixels = [r for r in _external_rows(cap.trace, "(numpy)") if r["category"] == Category.INPUT]
    assert [(r["action"], r["nbytes"], r["modality"]) for r in pixels] == [
        (Action.ALLOC, 3 * side * side * 4, Modality.VISION)
    ]  # still alive when the capture stops: no release row


def test_mapped_weights_that_half_drops_are_mapped_then_released() -> None:
    """transformers maps a safetensors checkpoint; ``.half()`` replaces every fp32 weight."""
    path = Path(tempfile.mkdtemp(prefix="memwarden-foreign-"))
    _tiny_llama().save_pretrained(path)
    fp32_bytes = sum(t.numel() * 4 for t in _tiny_llama().state_dict().values())
    with memwarden.capture() as cap:
        model = LlamaForCausalLM.from_pretrained(path).half().eval()
        with torch.no_grad():
            model(torch.ones(1, 4, dtype=torch.long))
    ev = cap.trace.events
    is_map, is_unmap = ev["action"] == Action.MAP, ev["action"] == Action.UNMAP
    in_file = np.array([(s or "").startswith(str(path)) for s in cap.trace.strings] + [False])[ev["op"]]
    mapped, released = is_map & in_file, is_unmap & in_file
    # every fp32 weight the checkpoint holds was mapped (tied embeddings are one storage) and released
    assert int(ev["nbytes"][mapped].sum()) == int(ev["nbytes"][released].sum()) > 0
    assert int(ev["nbytes"][mapped].sum()) <= fp32_bytes
    assert int(ev["nbytes"][mapped].sum()) >= 0.9 * fp32_bytes
    assert set(ev["category"][mapped].tolist()) == {Category.WEIGHT}
    assert sorted(ev["tensor"][mapped].tolist()) == sorted(ev["tensor"][released].tolist())
    # the half weights the run keeps are the allocator's, half the size
    kept = (ev["action"] == Action.ALLOC) & (ev["category"] == Category.WEIGHT)
    assert int(ev["nbytes"][kept].sum()) == sum(p.numel() * 2 for p in model.state_dict().values())


def test_a_wrapped_allocator_block_is_counted_once() -> None:
    """``torch.from_numpy(t.numpy())`` is a second storage over an allocator block's memory."""
    model = _tiny_llama()
    with memwarden.capture() as cap, torch.no_grad():
        ids = torch.arange(3, 203, dtype=torch.long).reshape(1, 200)
        model(torch.from_numpy(ids.numpy()))
    assert _external_rows(cap.trace) == []


def test_the_captures_own_reading_leaves_the_programs_tensors_as_they_were() -> None:
    """Fingerprinting a call's inputs and reading its attention mask must not go through
    ``Tensor.numpy()``, which marks a storage non-resizable for good: the program's ``resize_``
    would then fail after the capture, and the capture would take the tensors it read for
    foreign memory (a /proc/self/maps read each)."""
    model = _tiny_llama()
    ids = torch.arange(3, 35, dtype=torch.long).reshape(2, 16)  # (B, T)
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 12:] = 0  # the second row is padded
    with memwarden.capture() as cap, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        model(ids, attention_mask=mask)  # positional: read through the forward's signature
    assert not is_foreign(ids) and not is_foreign(mask)
    ids.resize_(2, 17)  # what a program may do with its own tensor after the capture
    assert _external_rows(cap.trace) == []
    assert cap.trace.metadata["input_padding"]  # the mask was still read


def test_a_governed_session_leaves_the_models_weights_as_they_were() -> None:
    """The session fingerprints its encoders' weights (the encoder cache's contract): read without
    ``Tensor.numpy()``, or every vision weight turns non-resizable and a later capture takes it for
    foreign memory."""
    from memwarden.runtime.session import GovernedSession

    model = zoo.build_model("llava", "tiny")
    GovernedSession(model, budget="256MiB").close()
    assert [name for name, p in model.named_parameters() if is_foreign(p)] == []


def test_weights_already_foreign_when_a_capture_starts_are_counted_once() -> None:
    """A storage first recorded where it enters a call (foreign) and then found by the scan of what
    existed before the capture is one storage: one row, not two (the demo's thermal check saw its
    vision weights twice, 42 MiB over a budget the session kept)."""
    model = zoo.build_model("llava", "tiny")
    for p in model.parameters():
        p.detach().numpy()  # what user code (or an older session) may have done: non-resizable from now on
    inputs = zoo.make_inputs("llava")
    with memwarden.capture() as cap, torch.no_grad():
        model(**inputs)
    ev, trace = cap.trace.events, cap.trace
    born = np.isin(ev["action"], [int(Action.PREEXISTING), int(Action.ALLOC), int(Action.MAP)])
    weights = born & (ev["category"] == int(Category.WEIGHT))
    addresses, counts = np.unique(ev["address"][weights], return_counts=True)
    assert counts.max() == 1, f"{int((counts > 1).sum())} weight storages recorded twice"
    assert int(ev["nbytes"][weights].sum()) == sum(p.numel() * p.element_size() for p in model.parameters())
    del trace


@pytest.mark.parametrize("assign", [False, True])
def test_a_mapped_state_dict_copied_into_a_model_is_in_the_trace(tmp_path: Path, assign: bool) -> None:
    """``model.load_state_dict(safetensors.torch.load_file(p))`` into a model already built: every
    mapped tensor is read into the model's own weights, so the state dict is in the trace (MAP rows,
    not weights) from the call on; with ``assign=True`` the mapped tensors become the weights and
    nothing is copied."""
    from safetensors.torch import load_file, save_file

    model = _tiny_llama()
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if "lm_head" not in k}, str(path))
    mapped = sum(v.nbytes for v in load_file(str(path)).values())
    original = torch.nn.Module.__dict__["load_state_dict"]
    with memwarden.capture() as cap:
        fresh = _tiny_llama()
        fresh.load_state_dict(load_file(str(path)), strict=False, assign=assign)
        fresh(torch.tensor([[1, 2, 3]]))
    trace = cap.trace
    assert trace is not None
    ev = trace.events
    state = (ev["action"] == Action.MAP) & (ev["category"] != Category.WEIGHT)
    if assign:
        assert not state.any()
    else:
        assert int(ev["nbytes"][state].sum()) == mapped
    assert torch.nn.Module.__dict__["load_state_dict"] is original  # put back when the capture stops
