"""Video-LLaVA served in bfloat16 with a home-made int8 weight-only quantisation of the language
model's linear layers (a quantize.py from an edge-deployment repo: per-output-row absmax scales).

Int8Linear.forward dequantises its whole weight on every call to float32 (the scales are stored
in fp32 and the product is computed in fp32), then casts the bf16 activations up to match: every
projection and the 32k-row lm_head materialise a full fp32 weight copy per decode step.
"""

import numpy as np
import torch
import torch.nn.functional as F

import _common as C

EXPECT = "dequant-temporaries"
FIX_WORDS = ["dtype", "bfloat16", "dequantize", "float32", "x.dtype"]

FRAMES = 8


class Int8Linear(torch.nn.Module):
    def __init__(self, lin: torch.nn.Linear):
        super().__init__()
        out_f = lin.weight.shape[0]
        q = torch.empty(lin.weight.shape, dtype=torch.int8)
        scale = torch.empty(out_f, 1)
        with torch.no_grad():
            for r in range(0, out_f, 2048):  # row blocks, so quantising never holds a full fp32 copy
                w = lin.weight[r : r + 2048].float()
                scale[r : r + 2048] = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127.0
                q[r : r + 2048] = torch.round(w / scale[r : r + 2048]).to(torch.int8)
        self.register_buffer("qweight", q)
        self.register_buffer("scale", scale)  # fp32, (out, 1)
        self.bias = lin.bias

    def forward(self, x):
        w = self.qweight.to(torch.float32) * self.scale  # MISTAKE
        y = F.linear(x.to(w.dtype), w, None if self.bias is None else self.bias.to(w.dtype))
        return y.to(x.dtype)


def quantize_language_model(model):
    lm = model.model.language_model
    targets = [(name, mod) for name, mod in lm.named_modules() if isinstance(mod, torch.nn.Linear)]
    for name, mod in targets:
        parent = lm.get_submodule(name.rsplit(".", 1)[0]) if "." in name else lm
        setattr(parent, name.rsplit(".", 1)[-1], Int8Linear(mod))
    model.lm_head = Int8Linear(model.lm_head)
    return model


model = C.video_llava(
    image_px=32, patch_px=8, vision_hidden=64, hidden=256, layers=2, vocab=32000, dtype=torch.bfloat16
)
model = quantize_language_model(model)
vocab = model.config.text_config.vocab_size
prompt = C.tokenize("USER: Describe the delivery in this doorbell clip. ASSISTANT:", vocab - 2)


@torch.no_grad()
def describe(clip_id: int) -> list[int]:
    frames = np.stack([C.fake_rgb(32, 32, seed=clip_id * 10 + f) for f in range(FRAMES)])
    video = C.normalize(frames).unsqueeze(0).to(torch.bfloat16)
    n = C.video_llava_tokens_per_frame(model) * FRAMES
    ids = torch.tensor([[C.BOS_ID] + [model.config.video_token_id] * n + prompt])
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        pixel_values_videos=video,
        max_new_tokens=12,
        do_sample=False,
    )
    return out[0, ids.shape[1] :].tolist()


if __name__ == "__main__":
    for clip in range(3):
        print(clip, describe(clip)[:6])
