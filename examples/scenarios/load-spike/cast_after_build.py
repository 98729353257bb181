"""A VLM built in float32 and then cast to bfloat16.

What is wrong: the deployment runs a LLaVA-style VLM in bfloat16, but the
script builds it with the model class's constructor, which materialises every
weight in the default dtype (float32), and only then calls
``.to(torch.bfloat16)``. The cast makes a bf16 copy of each weight while the
float32 originals are still alive: the load phase peaks at the float32 model
(2x the bf16 weights the run actually keeps), the largest footprint of the
whole run.

The fix (``cast_after_build_fixed.py``): build in the target dtype
(``Model._from_config(config, dtype=torch.bfloat16)``, or ``from_pretrained(...,
dtype=torch.bfloat16)`` for a checkpoint), so no float32 weight ever exists.

Run: ``python cast_after_build.py`` or ``memwarden trace cast_after_build.py``.
"""

from __future__ import annotations

import torch
from transformers import LlavaForConditionalGeneration

from memwarden.models import zoo


def main() -> None:
    config = zoo.build_config("llava", size="small")  # ~50M parameters, random weights, nothing downloaded
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config)  # float32 weights
    model = model.to(torch.bfloat16).eval()  # bf16 copies while the float32 weights are alive
    inputs = zoo.make_inputs(model, prompt_tokens=12)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=2, **zoo.generate_kwargs("llava"))
    print("generated", out[0, inputs["input_ids"].shape[1] :].tolist())


if __name__ == "__main__":
    main()
