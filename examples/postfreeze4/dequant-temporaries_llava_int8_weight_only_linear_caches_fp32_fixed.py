"""Serving a LLaVA model whose language model was stored as int8 weight-only (per-row scales) to fit
a small box, with a hand-written Int8Linear.

Int8Linear.forward dequantizes its weight on the fly for the matmul and drops the float32 copy
right after, so only one layer's float weight exists at a time.
"""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch
import transformers

from memwarden.models import zoo

EXPECT = None
FIX_WORDS = ["dequantize per call", "do not cache", "on the fly"]

HIDDEN, LAYERS, FFN = 512, 6, 1536


class Int8Linear(torch.nn.Module):
    def __init__(self, in_features, out_features, bias, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer(
            "qweight", torch.randint(-127, 128, (out_features, in_features), dtype=torch.int8, generator=g)
        )
        self.register_buffer("scale", torch.full((out_features, 1), 0.02 / 127))
        self.bias = torch.nn.Parameter(torch.zeros(out_features)) if bias else None

    def dequantize(self):
        return self.qweight.float() * self.scale

    def forward(self, x):
        w = self.dequantize()  # temporary, freed when forward returns
        return torch.nn.functional.linear(x, w, self.bias)


def load_quantized_llava():
    """Build the LLaVA skeleton on the meta device, swap the LM's Linear layers for Int8Linear
    (as a loader would, from the int8 checkpoint), then materialise the remaining float weights."""
    t = C.text_config(hidden=HIDDEN, layers=LAYERS, vocab=4096, ffn=FFN)
    cfg = transformers.LlavaConfig(
        vision_config={
            "model_type": "clip_vision_model",
            "image_size": 64,
            "patch_size": 8,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 128,
        },
        text_config={"model_type": "llama", **t},
        image_token_index=t["vocab_size"] - 1,
        image_seq_length=64,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        pad_token_id=C.PAD_ID,
    )
    with torch.device("meta"):
        model = transformers.LlavaForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")
    seed = 0
    for _name, module in list(model.model.language_model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear):
                seed += 1
                setattr(
                    module, child_name, Int8Linear(child.in_features, child.out_features, child.bias is not None, seed)
                )
    g = torch.Generator().manual_seed(1)
    for module in model.modules():
        for pname, p in list(module.named_parameters(recurse=False)):
            if p.is_meta:
                module._parameters[pname] = torch.nn.Parameter(torch.randn(p.shape, generator=g) * 0.02)
        for bname, b in list(module.named_buffers(recurse=False)):
            if b.is_meta:
                module._buffers[bname] = torch.zeros(b.shape, dtype=b.dtype)
    model.model.language_model.rotary_emb = type(model.model.language_model.rotary_emb)(model.config.text_config)
    return model.eval()


@torch.no_grad()
def answer(model, seed):
    inputs = zoo.make_inputs(model, image_size=(64, 64), prompt_tokens=32, seed=seed)
    return model.generate(**inputs, max_new_tokens=8, **zoo.generate_kwargs("llava"))


def main():
    model = load_quantized_llava()
    for request in range(3):
        out = answer(model, request)
        print(f"request {request}: {out.shape[1]} tokens")


if __name__ == "__main__":
    main()
