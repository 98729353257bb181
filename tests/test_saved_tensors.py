"""What autograd saves for backward is told apart from other activations: the capture reads the
graph behind each model call's outputs and names each block the forward kept for its gradient,
in ``trace.metadata["saved_for_backward"]``; a step under ``torch.no_grad()`` keeps none."""

from __future__ import annotations

import gc
import subprocess
import sys

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

import memwarden
from memwarden.models import zoo
from memwarden.trace.model import Action, Category


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 128))


def test_a_training_step_names_the_activations_backward_keeps() -> None:
    gc.collect()
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(64, 128)
    with memwarden.capture() as cap:
        for _ in range(2):
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    t = cap.trace
    saved = t.metadata["saved_for_backward"]
    ids = np.array(saved["tensors"], dtype=np.int64)
    alloc = t.events["action"] == Action.ALLOC
    rows = alloc & np.isin(t.events["tensor"], ids)
    assert int(rows.sum()) == len(ids) == len(set(saved["tensors"]))  # each a block of the trace, once
    # Per step, the model's graph keeps GELU's input and Linear2's input (64x512 each); x and
    # the weights were not made in the capture (or are weights), so they are not counted, and
    # the loss (pow, outside the model) is the script's.
    assert saved["nbytes"] == int(t.events["nbytes"][rows].sum()) == 2 * 2 * 64 * 512 * 4
    assert [t.shape(i) for i in t.events["shape"][rows]] == [(64, 512)] * 4
    assert set(t.events["category"][rows].tolist()) == {Category.ACTIVATION}


def test_a_no_grad_step_saves_nothing() -> None:
    gc.collect()
    model = _mlp()
    x = torch.randn(64, 128)
    with memwarden.capture() as cap:
        with torch.no_grad():
            model(x).pow(2).mean()
    assert "saved_for_backward" not in cap.trace.metadata


def test_a_transformers_training_step_against_its_no_grad_twin() -> None:
    gc.collect()
    model = zoo.build_model("llava", size="tiny")
    inputs = zoo.make_inputs(model, prompt_tokens=12)
    with memwarden.capture() as trained:
        out = model(**inputs, labels=inputs["input_ids"])
        out.loss.backward()
    del out
    model.zero_grad(set_to_none=True)
    with memwarden.capture() as evaluated:
        with torch.no_grad():
            model(**inputs, labels=inputs["input_ids"])
    saved = trained.trace.metadata["saved_for_backward"]
    t = trained.trace
    rows = (t.events["action"] == Action.ALLOC) & np.isin(t.events["tensor"], saved["tensors"])
    assert saved["nbytes"] > 0 and int(rows.sum()) == len(saved["tensors"])
    assert Category.WEIGHT not in set(t.events["category"][rows].tolist())
    assert "saved_for_backward" not in evaluated.trace.metadata


class _Masked(torch.nn.Module):
    """A forward that vmaps a function, as transformers' masks do for custom mask functions:
    torch.func refuses to run under saved-tensor hooks, so the capture must not install any."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.vmap(lambda row: row > 0)(x)
        return torch.nn.functional.gelu(self.proj(x)) * mask


def test_vmap_and_checkpoint_run_as_without_a_capture() -> None:
    gc.collect()
    torch.manual_seed(0)
    model = _Masked()
    x = torch.randn(16, 32)
    with memwarden.capture() as cap:
        model(x).sum().backward()
        with torch.autograd.graph.disable_saved_tensors_hooks("refused"):
            model(x).sum().backward()
        # A checkpointed call keeps nothing for backward (it recomputes): none of its saved
        # tensors is named, and reading the graph does not recompute it.
        ran = []
        model.register_forward_pre_hook(lambda m, a: ran.append(1))
        out = checkpoint(model, x.requires_grad_(), use_reentrant=False)
        assert len(ran) == 1
        out.sum().backward()
    saved = cap.trace.metadata["saved_for_backward"]
    t = cap.trace
    rows = (t.events["action"] == Action.ALLOC) & np.isin(t.events["tensor"], saved["tensors"])
    # Two plain calls, each keeping the projection's output for GELU's backward (16x32 float)
    # and the vmapped mask for the product's (16x32 bool); the checkpointed call adds none.
    assert sorted(t.events["nbytes"][rows].tolist()) == [16 * 32] * 2 + [16 * 32 * 4] * 2


_KILLED = """
import os, torch, memwarden
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 128))
x = torch.randn(64, 128)
cap = memwarden.capture(stream_to={path!r}).__enter__()
# No 100 ms flush from the streamer's thread: on a loaded machine one can land mid-op and stream a
# row before its op fills in its shape; step boundaries and the flush below see finished ops only.
cap._streamer._stop.set()
m(x).pow(2).mean().backward()
kept = m(x)  # a graph held when the process dies: its saved activations are alive
cap._streamer.flush("test")  # what the 100 ms flush would write, without waiting for it
os._exit(0)
"""


def test_a_stream_cut_short_keeps_the_saved_tag(tmp_path) -> None:
    path = tmp_path / "killed.mwtrace"
    subprocess.run([sys.executable, "-c", _KILLED.format(path=str(path))], check=True, timeout=120)
    t = memwarden.load(path)
    assert t.metadata["recovered"]["complete"] is False
    saved = t.metadata["saved_for_backward"]
    rows = (t.events["action"] == Action.ALLOC) & np.isin(t.events["tensor"], saved["tensors"])
    # Both forwards: GELU's and Linear2's inputs (64x512).
    assert [t.shape(i) for i in t.events["shape"][rows]] == [(64, 512)] * 4
    assert saved["nbytes"] == 4 * 64 * 512 * 4
