"""Live capture on real transformers models: agreement with PyTorch's memory profiler,
weights, attribution of categories / modalities / phases, file-backed weights, training."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import memwarden
from memwarden.analyze.timeline import summary
from memwarden.models import zoo
from memwarden.record.live.reference import profiler_peak_bytes
from memwarden.record.live.reference import state_bytes as model_state_bytes
from memwarden.record.modality import ModalityRules
from memwarden.trace.model import Action, Category, Modality, Phase, SpanKind


@pytest.mark.parametrize("name", zoo.NAMES)
def test_peak_matches_pytorch_profiler_and_weights_are_exact(name: str) -> None:
    model = zoo.build_model(name, size="tiny")
    inputs = zoo.make_inputs(model, prompt_tokens=12)
    kwargs = zoo.generate_kwargs(name)
    with torch.inference_mode():
        model.generate(**inputs, max_new_tokens=2, **kwargs)  # warm caches of lazy kernels
    with memwarden.capture() as cap:
        with profile(
            activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
        ) as prof:
            with torch.inference_mode():
                model.generate(**inputs, max_new_tokens=3, **kwargs)
    s = summary(cap.trace)
    reference = profiler_peak_bytes(prof)
    assert abs(s.peak_bytes - reference) <= 0.01 * reference, (s.peak_bytes, reference)
    assert s.weights_bytes == model_state_bytes(model)
    # Attribution: every phase of a generate() run, the KV cache, the encoder's modality.
    assert {"encode", "prefill", "decode"} <= set(s.by_phase_peak)
    t = cap.trace
    cats = set(t.events["category"].tolist())
    assert Category.KV_CACHE in cats and Category.WEIGHT in cats
    encoder = Modality.AUDIO if zoo.spec(name).modality == "audio" else Modality.VISION
    made = (t.events["modality"] == encoder) & (t.events["action"] == Action.ALLOC)
    enc_rows = made & (t.events["category"] != Category.INPUT)  # the program's media inputs: not encoded yet
    assert enc_rows.any()
    assert set(t.events["phase"][enc_rows].tolist()) == {Phase.ENCODE}
    steps = [sp for sp in t.metadata["steps"]]
    assert [sp["phase"] for sp in steps] == ["prefill", "decode", "decode"]


def test_encoder_spans_carry_content_fingerprints() -> None:
    model = zoo.build_model("llava", size="tiny")
    a = zoo.make_inputs(model, prompt_tokens=12, seed=0)
    b = zoo.make_inputs(model, prompt_tokens=12, seed=1)  # another image
    kwargs = zoo.generate_kwargs("llava")
    with memwarden.capture() as cap, torch.inference_mode():
        for inputs in (a, a, b):
            model.generate(**inputs, max_new_tokens=1, **kwargs)
    t = cap.trace
    fps = [
        t.string(int(t.spans["fingerprint"][i]))
        for i in range(t.num_spans)
        if t.spans["kind"][i] == SpanKind.MODULE and t.string(int(t.spans["name"][i])) == "model.vision_tower"
    ]
    assert len(fps) == 3 and fps[0] == fps[1] != fps[2]


def test_a_users_modality_rule_moves_parameters_and_activations_alike() -> None:
    # The projector is fusion by default; a user's rule makes it audio (a modality LLaVA has
    # nowhere else, so every audio byte must come from the projector).
    model = zoo.build_model("llava", size="tiny")
    inputs = zoo.make_inputs(model, prompt_tokens=12)
    rules = ModalityRules().with_rules({"multi_modal_projector": "audio"})
    with memwarden.capture(modality_rules=rules) as cap, torch.inference_mode():
        model.generate(**inputs, max_new_tokens=2, **zoo.generate_kwargs("llava"))
    t = cap.trace
    e = t.events
    module = [t.string(int(i)) if i >= 0 else "" for i in e["module"].tolist()]
    in_projector = np.array([m.startswith("model.multi_modal_projector") for m in module])
    audio = e["modality"] == Modality.AUDIO

    weights = np.isin(e["action"], [Action.PREEXISTING, Action.ALLOC]) & (e["category"] == Category.WEIGHT)
    projector_bytes = sum(p.nbytes for p in model.model.multi_modal_projector.parameters())
    assert int(e["nbytes"][weights & in_projector].sum()) == projector_bytes
    assert set(e["modality"][weights & in_projector].tolist()) == {Modality.AUDIO}

    made = (e["action"] == Action.ALLOC) & np.isin(e["category"], [Category.ACTIVATION, Category.TEMPORARY])
    assert (made & in_projector & (e["category"] == Category.ACTIVATION)).any()
    assert set(e["modality"][made & in_projector].tolist()) == {Modality.AUDIO}
    assert set(e["phase"][made & in_projector].tolist()) == {Phase.ENCODE}  # audio is an encoder's modality
    assert not (audio & ~in_projector).any()

    spans = [
        int(t.spans["modality"][i])
        for i in range(t.num_spans)
        if t.spans["kind"][i] == SpanKind.MODULE and t.string(int(t.spans["name"][i])) == "model.multi_modal_projector"
    ]
    assert spans and set(spans) == {Modality.AUDIO}


def test_mmap_weights_are_file_backed(tmp_path) -> None:
    def make() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))

    torch.save(make().state_dict(), tmp_path / "w.pt")
    with memwarden.capture() as cap:
        with torch.device("meta"):
            model = make()
        model.load_state_dict(torch.load(tmp_path / "w.pt", mmap=True), assign=True)
        model(torch.randn(4, 256))
    t = cap.trace
    maps = t.events["action"] == Action.MAP
    weight_bytes = sum(p.nbytes for p in model.parameters())
    assert int(t.events["nbytes"][maps].sum()) == weight_bytes
    assert all(str(tmp_path / "w.pt") == t.string(int(op)) for op in t.events["op"][maps])
    s = summary(t)
    assert s.file_backed_bytes_at_peak == weight_bytes
    assert s.anonymous_peak_bytes == s.peak_bytes - weight_bytes


def test_training_step_categories_and_phases() -> None:
    gc.collect()  # models of earlier tests would count as preexisting weights
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 128))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(64, 128)
    with memwarden.capture() as cap:
        for _ in range(2):
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    t = cap.trace
    s = summary(t)
    param_bytes = sum(p.nbytes for p in model.parameters())
    assert s.weights_bytes == param_bytes
    alloc = t.events["action"] == Action.ALLOC
    opt_state = alloc & (t.events["category"] == Category.OPTIMIZER_STATE)
    assert int(t.events["nbytes"][opt_state].sum()) == 2 * param_bytes  # exp_avg + exp_avg_sq, made once
    grads = alloc & (t.events["category"] == Category.GRADIENT)
    assert int(t.events["nbytes"][grads].sum()) == 2 * param_bytes  # set_to_none: fresh grads each step
    assert {"backward", "optimizer"} <= set(s.by_phase_peak)
    acts = alloc & (t.events["category"] == Category.ACTIVATION)
    assert acts.any()


def test_capture_survives_exceptions_and_keeps_events() -> None:
    model = torch.nn.Linear(16, 16)
    cap = memwarden.capture()
    with pytest.raises(RuntimeError):
        with cap:
            model(torch.randn(2, 16))
            model(torch.randn(2, 17))  # shape error inside the module
    t = cap.trace
    assert t is not None and t.num_events > 0
    assert (t.spans["end_us"] >= t.spans["start_us"]).all()
    # the next capture starts clean
    with memwarden.capture() as again:
        model(torch.randn(2, 16))
    assert again.trace.metadata["untracked_frees"] >= 0


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="Linux only")
def test_preexisting_tensors_count_from_the_start() -> None:
    big = torch.zeros(1 << 20)  # 4 MiB alive before capture
    with memwarden.capture() as cap:
        small = torch.ones(10)
    t = cap.trace
    pre = t.events["action"] == Action.PREEXISTING
    assert big.untyped_storage().data_ptr() in t.events["address"][pre].tolist()
    assert summary(t).peak_bytes >= big.nbytes + small.nbytes


def test_module_spans_nest_properly() -> None:
    model = zoo.build_model("qwen2-vl", size="tiny")
    inputs = zoo.make_inputs(model, prompt_tokens=12)
    with memwarden.capture() as cap, torch.inference_mode():
        model.generate(**inputs, max_new_tokens=2, **zoo.generate_kwargs("qwen2-vl"))
    s = cap.trace.spans
    module_rows = (s["kind"] == SpanKind.MODULE).nonzero()[0]
    assert len(module_rows) > 50
    for row in module_rows.tolist():
        parent = int(s["parent"][row])
        if parent < 0:
            assert s["depth"][row] == 0
            continue
        assert s["kind"][parent] == SpanKind.MODULE
        assert s["depth"][parent] == s["depth"][row] - 1
        assert s["start_us"][parent] <= s["start_us"][row] and s["end_us"][row] <= s["end_us"][parent]
    names = {cap.trace.string(int(n)) for n in s["name"][module_rows]}
    assert "model.visual" in names and "model.language_model" in names
