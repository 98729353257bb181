"""Fixed twin of ``cast_after_build.py``: build the VLM directly in bfloat16.

``_from_config(config, dtype=torch.bfloat16)`` (like ``from_pretrained(...,
dtype=torch.bfloat16)``) creates every weight in bf16: the load phase never
holds a float32 copy, and the load peak equals the bf16 weights.

Run: ``python cast_after_build_fixed.py`` or ``memwarden trace cast_after_build_fixed.py``.
"""

from __future__ import annotations

import torch
from transformers import LlavaForConditionalGeneration

from memwarden.models import zoo


def main() -> None:
    config = zoo.build_config("llava", size="small")  # ~50M parameters, random weights, nothing downloaded
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration._from_config(config, dtype=torch.bfloat16).eval()
    inputs = zoo.make_inputs(model, prompt_tokens=12)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=2, **zoo.generate_kwargs("llava"))
    print("generated", out[0, inputs["input_ids"].shape[1] :].tolist())


if __name__ == "__main__":
    main()
