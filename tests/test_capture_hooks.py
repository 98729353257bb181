"""The capture's module hooks: nested calls of modules that are no boundary run in C++ (native.cpp
``module_pre``/``module_post``), every other call in Python. Both must give the same spans, the
same attribution and the same steps as before the split."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import memwarden
from memwarden.trace.model import Action, SpanKind


class Tower(nn.Module):  # a vision tower: a boundary (its modality differs from the root's)
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).relu()


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.vision_tower = Tower()
        self.layers = nn.ModuleList([nn.Linear(64, 64) for _ in range(3)])
        self.head = nn.Linear(64, 8)

    def forward(self, pixel_values: torch.Tensor, fail_at: int = -1) -> torch.Tensor:
        x = self.vision_tower(pixel_values)
        for k, layer in enumerate(self.layers):
            if k == fail_at:
                raise RuntimeError("boom")
            x = layer(x)
        return self.head(x)


def _module_spans(trace: memwarden.Trace) -> list[tuple[str, int, int]]:
    """(name, depth, fingerprint string id) of each module span, in call order."""
    s = trace.spans
    return [
        (trace.string(int(s["name"][i])), int(s["depth"][i]), int(s["fingerprint"][i]))
        for i in range(trace.num_spans)
        if s["kind"][i] == SpanKind.MODULE
    ]


def test_nested_calls_keep_their_spans_and_attribution() -> None:
    model = Model()
    x = torch.randn(32, 64)
    with memwarden.capture() as cap, torch.no_grad():
        model(x)
        model(x)
    spans = _module_spans(cap.trace)
    names = [n for n, _, _ in spans]
    one_call = ["Model", "vision_tower", "vision_tower.proj", "layers.0", "layers.1", "layers.2", "head"]
    assert names == one_call * 2
    depth = {n: d for n, d, _ in spans}
    assert depth == {
        "Model": 0,
        "vision_tower": 1,
        "vision_tower.proj": 2,
        "layers.0": 1,
        "layers.1": 1,
        "layers.2": 1,
        "head": 1,
    }
    # Roots and boundaries carry an input fingerprint; calls the native path took alone carry none.
    with_fp = {n for n, _, fp in spans if fp >= 0}
    assert with_fp == {"Model", "vision_tower"}
    # Activations made inside a nested Linear are that module's.
    e = cap.trace.events
    made = e["action"] == Action.ALLOC
    modules = {cap.trace.string(int(m)) for m in e["module"][made].tolist() if m >= 0}
    assert {"layers.0", "layers.1", "head", "vision_tower.proj"} <= modules
    assert len(cap.trace.metadata["steps"]) == 2


def test_a_call_cut_short_by_an_exception_leaves_the_next_call_a_step() -> None:
    model = Model()
    x = torch.randn(8, 64)
    with memwarden.capture() as cap, torch.no_grad():
        with pytest.raises(RuntimeError, match="boom"):
            model(x, fail_at=2)
        model(x)
        model.layers[0](x)  # a nested module called on its own, from outside: the Python path
    steps = cap.trace.metadata["steps"]
    assert len(steps) == 2  # the failed call and the good one: both roots called from outside
    names = [n for n, _, _ in _module_spans(cap.trace)]
    assert names[-1] == "layers.0" and names.count("head") == 1


def test_hooks_are_gone_after_the_capture() -> None:
    model = Model()
    x = torch.randn(4, 64)
    with memwarden.capture():
        model(x)
    from torch.nn.modules import module as torch_module

    assert not torch_module._global_forward_hooks and not torch_module._global_forward_pre_hooks
    with memwarden.capture() as cap:  # a second capture registers afresh
        model(x)
    assert [n for n, _, _ in _module_spans(cap.trace)][:2] == ["Model", "vision_tower"]
