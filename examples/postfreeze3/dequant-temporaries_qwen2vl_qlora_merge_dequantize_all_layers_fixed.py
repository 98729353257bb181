"""Fixed twin: the QLoRA merge dequantises, merges and re-quantises one layer at a time.

What the user did: after QLoRA fine-tuning of a Qwen2-VL model (int8 base weights with LoRA adapters
on every linear layer of the language model), a merge script first builds a dict with the
dequantised float32 weight of every quantised layer and then adds each ``B @ A`` update and
re-quantises. The whole language model's weights exist in float32 at once next to the quantised
ones, which is what runs out of memory while merging.
Answer in the source: merge layer by layer: dequantise one weight "just in time", add the LoRA update,
re-quantise, and free it before the next layer (or let the merge dispatch per layer); then the memory
increase is negligible.
Sources: https://github.com/unslothai/unsloth/issues/432 ; https://github.com/unslothai/unsloth/issues/1532 ;
https://github.com/Lightning-AI/litgpt/pull/771
Reproduction: a tiny random-weight Qwen2-VL built in bf16 (hidden 512, 8 layers, ffn 2048) whose
language-model linears are replaced by int8 weights with per-row scales plus rank-16 LoRA adapters;
the merge dequantises each weight just before merging it and frees it right after, and the
merged model answers one image question.
"""

import _common as c
import torch
from torch import nn

EXPECT = None


class QLoRALinear(nn.Module):
    """int8 weight + per-row scale (bitsandbytes-like) with a LoRA adapter; dequantises per call."""

    def __init__(self, linear: nn.Linear, rank: int = 16):
        super().__init__()
        w = linear.weight.detach().float()
        self.scale = nn.Parameter(w.abs().amax(dim=1, keepdim=True) / 127.0, requires_grad=False)
        self.qweight = nn.Parameter(torch.round(w / self.scale).to(torch.int8), requires_grad=False)
        self.bias = linear.bias
        self.lora_a = nn.Parameter(torch.randn(rank, w.shape[1]) * 0.01)
        self.lora_b = nn.Parameter(torch.randn(w.shape[0], rank) * 0.01)

    def dequantize(self) -> torch.Tensor:
        return self.qweight.float() * self.scale

    def requantize(self, w: torch.Tensor) -> None:
        self.scale.data = w.abs().amax(dim=1, keepdim=True) / 127.0
        self.qweight.data = torch.round(w / self.scale).to(torch.int8)

    def forward(self, x):
        w = self.dequantize().to(x.dtype)
        y = nn.functional.linear(x, w, self.bias)
        return y + (x @ self.lora_a.T.to(x.dtype)) @ self.lora_b.T.to(x.dtype)


def quantize_language_model(model) -> dict[str, QLoRALinear]:
    layers = {}
    for name, module in list(model.model.language_model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                q = QLoRALinear(child)
                setattr(module, child_name, q)
                layers[f"{name}.{child_name}"] = q
    return layers


def main() -> None:
    model = c.qwen_vl("qwen2-vl", hidden=512, layers=8, ffn=2048, vocab=4096, vision_hidden=32, dtype=torch.bfloat16)
    with torch.no_grad():
        qlayers = quantize_language_model(model)
        for q in qlayers.values():
            merged = q.dequantize() + q.lora_b @ q.lora_a
            q.requantize(merged)
            q.lora_b.zero_()
            del merged
    inputs = c.qwen_inputs(model, images=[c.normalize(c.fake_rgb(224, 224))], prompt_tokens=16)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    print(f"merged {len(qlayers)} layers; answer {out[0, inputs['input_ids'].shape[1] :].tolist()}")


if __name__ == "__main__":
    main()
