import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""An image-text retrieval service ships its SigLIP weights as a Q8_0-style checkpoint (int8 blocks of
32 with one fp32 scale each) to fit a small box. The loader builds the model skeleton on the meta
device and attaches the checkpoint's linears as Q8Linear modules that keep the int8 blocks and
dequantize one weight temporarily per forward."""

import torch
import transformers
from torch import nn

EXPECT = None

BLOCK = 32


def dequantize_q8(q, scale):
    return (q.float().view(q.shape[0], -1, BLOCK) * scale.unsqueeze(-1)).view(q.shape)


class Q8Linear(nn.Module):
    """Keeps the int8 blocks; dequantizes one weight temporarily in each forward."""

    def __init__(self, q, scale, bias):
        super().__init__()
        self.register_buffer("q", q)
        self.register_buffer("scale", scale)
        self.bias = bias

    def forward(self, x):
        return nn.functional.linear(x, dequantize_q8(self.q, self.scale), self.bias)


class DenseLinear(nn.Module):
    def __init__(self, weight, bias, q, scale):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = bias
        self.q, self.scale = q, scale  # kept for re-export

    def forward(self, x):
        return nn.functional.linear(x, self.weight, self.bias)


def read_q8_checkpoint(skeleton, seed=0):
    """Stands in for reading the .gguf-like file: int8 blocks + fp32 scales for every linear."""
    g = torch.Generator().manual_seed(seed)
    ckpt = {}
    for name, mod in skeleton.named_modules():
        if type(mod) is nn.Linear:  # the pooling head's MultiheadAttention keeps its own small out_proj
            out_f, in_f = mod.weight.shape
            ckpt[name] = (
                torch.randint(-127, 128, (out_f, in_f), dtype=torch.int8, generator=g),
                torch.rand(out_f, in_f // BLOCK, generator=g) * 0.02 / 127,
            )
    return ckpt


def attach_weights(model, ckpt):
    for name, (q, scale) in ckpt.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        out_f = q.shape[0]
        bias = nn.Parameter(torch.zeros(out_f), requires_grad=False)
        new = Q8Linear(q, scale, bias)
        setattr(parent, child, new)
    for mod in model.modules():  # norms, embeddings, logit scale: small, materialised from meta
        for pname, p in list(mod._parameters.items()):
            if p is not None and p.is_meta:
                mod._parameters[pname] = nn.Parameter(torch.randn(p.shape) * 0.02, requires_grad=False)
    return model.eval()


@torch.no_grad()
def main():
    torch.manual_seed(0)
    cfg = C.siglip().config
    for sub in (cfg.text_config, cfg.vision_config):
        sub.hidden_size, sub.intermediate_size, sub.num_hidden_layers, sub.num_attention_heads = 384, 1536, 6, 6
    cfg.text_config.projection_size = 384
    with torch.device("meta"):
        skeleton = transformers.SiglipModel(cfg)
    ckpt = read_q8_checkpoint(skeleton)
    model = attach_weights(skeleton, ckpt)
    gallery = C.normalize_float(torch.rand(16, 3, 64, 64))
    img = model.get_image_features(pixel_values=gallery).pooler_output
    ids = torch.randint(3, 2000, (4, 16), generator=torch.Generator().manual_seed(1))
    txt = model.get_text_features(input_ids=ids).pooler_output
    best = (nn.functional.normalize(txt, dim=-1) @ nn.functional.normalize(img, dim=-1).T).argmax(-1)
    print("best image per query:", best.tolist())


if __name__ == "__main__":
    main()
