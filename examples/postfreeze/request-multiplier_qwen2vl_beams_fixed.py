"""Fixed twin of request-multiplier_qwen2vl_beams: greedy decoding (``num_beams=1``), one copy of
the page's patches, prefill and KV cache.

Source: https://github.com/QwenLM/Qwen3-VL/issues/205 (num_beams=2 OOM on Qwen2-VL);
https://github.com/Vision-CAIR/MiniGPT-4/issues/11 — "suggest to use a small beam size".
"""

import _common as c
import torch

from memwarden.models import zoo

EXPECT = None


def main() -> None:
    torch.manual_seed(0)
    model = c.qwen2_vl(hidden=256, layers=4, vocab=8192)
    kwargs = zoo.generate_kwargs("qwen2-vl")  # greedy, num_beams=1
    with torch.no_grad():
        for page in range(1):
            inputs = zoo.make_inputs(model, image_size=(336, 336), prompt_tokens=32, seed=page)
            out = model.generate(**inputs, max_new_tokens=6, **kwargs)
            print(f"page {page}: answer {out[0, inputs['input_ids'].shape[1] :].tolist()}")


if __name__ == "__main__":
    main()
