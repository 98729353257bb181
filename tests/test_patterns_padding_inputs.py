"""alignment-padding on batches padded outside torch (``analyze/patterns/padding_inputs.py``).

A collator pads with numpy to ``max_length`` and the model is called once, with keywords, on a
model built inside the capture (its first call is the one whose hooks come late): the capture
reads the attention mask, and diagnose names the padding with the fix to pad to the longest row.
The same batch padded to its longest row raises nothing.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import memwarden
from memwarden.analyze.diagnose import diagnose
from memwarden.trace.model import Trace

ROWS = [list(range(3, 3 + n)) for n in (20, 33, 41, 27)]  # (4 sentences of 20-41 tokens)


def _collate(max_length: int | None) -> dict[str, torch.Tensor]:
    length = max_length or max(len(r) for r in ROWS)
    ids = np.zeros((len(ROWS), length), dtype=np.int64)  # pad id 0
    mask = np.zeros((len(ROWS), length), dtype=np.int64)
    for i, row in enumerate(ROWS):
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
    return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}


def _run(max_length: int | None) -> Trace:
    with memwarden.capture() as cap:
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=500,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=1024,
        )
        model = LlamaForCausalLM._from_config(config).eval()
        with torch.no_grad():
            model(**_collate(max_length))
    assert cap.trace is not None
    return cap.trace


def test_padding_to_max_length_is_named_with_the_longest_row() -> None:
    trace = _run(max_length=512)
    [padding] = trace.metadata["input_padding"]
    assert {k: padding[k] for k in ("length", "longest", "real", "batch")} == {
        "length": 512,
        "longest": 41,
        "real": sum(len(r) for r in ROWS),
        "batch": 4,
    }
    found = [f for f in diagnose(trace) if f.pattern == "alignment-padding" and f.where.startswith("inputs")]
    assert len(found) == 1
    finding = found[0]
    assert finding.severity in ("medium", "high")  # the padded step is the run's peak
    assert "longest" in finding.fix and "512" in finding.fix and "41" in finding.fix
    assert finding.evidence["peak_in_padded_step"] is True
    assert 0 < finding.peak_added_bytes <= finding.evidence["step_working_bytes"]


def test_padding_to_the_longest_row_raises_nothing() -> None:
    trace = _run(max_length=None)
    assert trace.metadata["input_padding"][0]["length"] == 41  # the mask pads the shorter rows
    assert [f for f in diagnose(trace) if f.pattern == "alignment-padding"] == []
