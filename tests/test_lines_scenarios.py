"""Every planted scenario's finding names the planted line first (issue 25).

Each script of ``examples/scenarios/<pattern>/`` that is not a ``_fixed`` twin makes one mistake.
It is captured in-process as ``memwarden trace`` runs it (as ``__main__``, its folder on
``sys.path``) and diagnosed as ``memwarden diagnose --json`` does; the first of its pattern's
finding's ``lines`` must be the line a user changes to apply the fix. A line is named by a piece of
its text (unique in the script), never by its number, so editing a scenario's layout keeps the
test meaningful.
"""

from __future__ import annotations

import contextlib
import gc
import io
from pathlib import Path
from typing import Any

import pytest

from test_lines import _realworld_accuracy

SCENARIOS = Path(__file__).resolve().parents[1] / "examples" / "scenarios"
ACCURACY = _realworld_accuracy()

# script (relative to examples/scenarios) -> a piece of the planted line's text, and why that line.
PLANTED_LINES = {
    # The F.pad up to the next power of two is the padding to take out (the line above it only
    # computes the int target; it allocates nothing a trace could name).
    "alignment-padding/pow2_fusion_padding.py": "x = F.pad(x, (0, 0, 0, target - x.shape[1]))",
    # The cat with zeros up to MAX_IMAGE_TOKENS makes the fixed-size slot (inside the projector's
    # forward: the fix edits the model's code, not the call).
    "alignment-padding/projector_max_tokens.py": "x = torch.cat([x, pad], dim=1)",
    # The whole-weight float32 dequantisation, replaced by the fused int4 matmul in the twin.
    "dequant-temporaries/int4_naive_linear.py": "w = (q.float() - self.zeros[..., None]) * self.scales[..., None]",
    # The per-call bf16 copy of the int8 weight, replaced by torch._weight_int8pack_mm in the twin.
    "dequant-temporaries/int8_weight_upcast.py": "return F.linear(x, self.weight.to(x.dtype) * self.scale[:, None])",
    # The request's ids at its exact (batch, length): the twin pads them to a bucket here (the mask
    # line and the call change too; the ids are the heaviest input of changing shape).
    "fragmentation/random_shapes_serving.py": "ids = torch.randint(0, VOCAB, (batch, length))",
    # The vision batch at whatever image count the request has: the twin pads it to 4 or 8 here.
    "fragmentation/variable_image_count.py": "patches = torch.randn(n_img, PATCHES, PATCH_DIM)",
    # The list that keeps each validation loss with its graph.
    "graph-retention/eval_losses_in_list.py": "val_losses.append(F.cross_entropy(model(mels), labels))",
    # The list that keeps every micro-batch's loss, and so its graph, until the step's backward.
    "graph-retention/microbatch_loss_sum.py": "losses.append(model(patches, tokens))",
    # The cat that copies the whole cache every step (inside the attention's forward).
    "kv-concat-growth/manual_kv_list_concat.py": "k = torch.cat([past[0], k], dim=2)",
    # The cat that grows the stacked cache tensor every step.
    "kv-concat-growth/stacked_kv_tensor.py": "cache = torch.cat([cache, new_kv], dim=-2)  # the mistake",
    # generate() with the whole conversation and the image, no cache kept: the twin passes the cache
    # and drops pixel_values in this call.
    "kv-reprefill/chat_resend_image.py": "ids = model.generate(",
    # generate() over prefix + image for every question: the twin passes a copy of the prefix cache.
    "kv-reprefill/multi_question_prefill.py": "out = model.generate(",
    # The model built in float32: the twin builds it in bf16 (_from_config(config, dtype=...)) here.
    "load-spike/cast_after_build.py": "model = LlavaForConditionalGeneration(config)",
    # The full state dict in RAM next to the built model: torch.load(path, mmap=True) in the twin.
    # The model's construction (the other duplicate) is recorded inside SpeechEncoder.__init__,
    # a line the fix never edits; the script's build line allocates nothing itself.
    "load-spike/load_then_half.py": "state = torch.load(path)",
    # The image at the camera's size: make_inputs is where the processor's max_pixels / the resize
    # applies (IMAGE_SIZE, the constant the twin changes, allocates nothing a trace could name).
    "vision-token-dominance/qwen2vl_large_image.py": "inputs = zoo.make_inputs(model, image_size=IMAGE_SIZE",
}


def planted_scripts() -> list[str]:
    return sorted(str(p.relative_to(SCENARIOS)) for p in SCENARIOS.glob("*/*.py") if not p.stem.endswith("_fixed"))


def findings_of(relpath: str) -> list[dict[str, Any]]:
    """``memwarden diagnose --json``'s findings on an in-process capture of the scenario, run as
    the real-world corpus runs its cases (``examples/realworld/accuracy.py`` ``diagnose_case``:
    as ``__main__``, its folder on ``sys.path``, one torch thread)."""
    path = SCENARIOS / relpath
    gc.collect()  # tensors of earlier tests would be preexisting rows of this capture
    with contextlib.redirect_stdout(io.StringIO()):
        return list(ACCURACY.diagnose_case(ACCURACY.Case(path, relpath.split("/")[0], ())))


def planted_line(source: str, marker: str) -> int:
    found = [i for i, text in enumerate(source.splitlines(), 1) if marker in text]
    assert len(found) == 1, (marker, found)  # a marker names one line, or the test would be ambiguous
    return found[0]


def test_every_planted_scenario_has_its_planted_line() -> None:
    assert sorted(PLANTED_LINES) == planted_scripts()


@pytest.mark.parametrize("relpath", sorted(PLANTED_LINES))
def test_finding_names_the_planted_line_on_the_scenario_corpus(relpath: str) -> None:
    pattern = relpath.split("/")[0]
    path = SCENARIOS / relpath
    findings = [f for f in findings_of(relpath) if f["pattern"] == pattern]
    assert findings, (relpath, pattern)
    lines = findings[0]["lines"]
    assert lines and all(set(x) == {"file", "line", "nbytes"} for x in lines), lines
    assert Path(lines[0]["file"]) == path, lines
    assert lines[0]["line"] == planted_line(path.read_text(), PLANTED_LINES[relpath]), lines
