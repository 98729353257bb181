"""Document-image question answering on a Qwen2-VL-style model with beam search (``num_beams=8``)
for "better" answers.

Source: https://github.com/QwenLM/Qwen3-VL/issues/205
  "随机采样改成 num_beams=2推理部分数据就会报错OOM，这个正常吗" (switching from sampling to
   num_beams=2 makes some samples OOM) — "CUDA out of memory. Tried to allocate 32.00 GiB."
See also https://github.com/Vision-CAIR/MiniGPT-4/issues/11 — "when I increased the beam size,
the GPU memory kept increasing" / "suggest to use a small beam size".

``generate`` expands the whole request per beam: input ids, the image patches (so the vision tower
encodes the page 8 times), the prefill activations and the KV cache are all multiplied by 8.
"""

import _common as c
import torch

from memwarden.models import zoo

EXPECT = "request-multiplier"
FIX_WORDS = ("num_beams",)


def main() -> None:
    torch.manual_seed(0)
    model = c.qwen2_vl(hidden=256, layers=4, vocab=8192)
    kwargs = {k: v for k, v in zoo.generate_kwargs("qwen2-vl").items() if k != "num_beams"}
    with torch.no_grad():
        for page in range(1):
            inputs = zoo.make_inputs(model, image_size=(336, 336), prompt_tokens=32, seed=page)
            out = model.generate(**inputs, max_new_tokens=6, num_beams=8, **kwargs)  # MISTAKE
            print(f"page {page}: answer {out[0, inputs['input_ids'].shape[1] :].tolist()}")


if __name__ == "__main__":
    main()
