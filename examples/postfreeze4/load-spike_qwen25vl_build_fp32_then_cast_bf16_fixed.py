"""A Qwen2.5-VL captioning worker on a small CPU box that runs the model in bfloat16.

The loader instantiates the model directly in bfloat16 (the `torch_dtype=torch.bfloat16` of
from_pretrained), so no float32 copy is ever materialised.
"""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch

EXPECT = None
FIX_WORDS = ["torch_dtype", "dtype=torch.bfloat16", "load directly"]

MODEL_KW = dict(kind="qwen2.5-vl", vision_hidden=64, vision_layers=2, hidden=1024, layers=10, vocab=32000, ffn=4096)


def load_worker_model():
    model = C.qwen_vl(**MODEL_KW, dtype=torch.bfloat16)
    return model.eval()


@torch.no_grad()
def caption(model, seed):
    img = C.resize(C.normalize(C.fake_rgb(224, 224, seed=seed)), 112, 112)
    inputs = C.qwen_inputs(model, images=[img], prompt_tokens=12, seed=seed)
    inputs["pixel_values"] = inputs["pixel_values"].to(torch.bfloat16)
    return model.generate(**inputs, max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=C.PAD_ID)


def main():
    model = load_worker_model()
    print("params (M):", sum(p.numel() for p in model.parameters()) / 1e6, next(model.parameters()).dtype)
    print(caption(model, 0).shape)


if __name__ == "__main__":
    main()
