"""Qwen2-VL chart QA that switches on beam search for "better" short answers.

What the user did: answers to chart questions are generated with ``num_beams=5`` (and
``output_scores``) instead of the demo's greedy decoding. ``generate`` expands the request for the
beams: ``pixel_values`` are duplicated ``num_beams`` times (the Qwen-VL issue shows the duplicated
patches), the vision tower and the prefill run on five copies and five KV caches are kept.
Answer in the source: the beam-search call is the one that runs out of memory while the same call
without ``num_beams`` works; decode greedily (``num_beams=1``) and limit the image pixels.
Sources: https://github.com/QwenLM/Qwen3-VL/issues/334 ; https://github.com/QwenLM/Qwen3-VL/issues/560
Reproduction: a tiny random-weight Qwen2-VL; two decoded 560x784 charts (560 image tokens each),
one 16-token answer per chart with ``num_beams=5``.
"""

import _common as c
import torch

EXPECT = "request-multiplier"
FIX_WORDS = ("num_beams", "greedy", "beam", "num_beams=1")


def main() -> None:
    model = c.qwen_vl("qwen2-vl", hidden=256, layers=3, ffn=1024, vocab=8192, vision_hidden=32)
    answers = []
    with torch.inference_mode():
        for i in range(2):
            chart = c.normalize(c.fake_rgb(560, 784, seed=i))
            inputs = c.qwen_inputs(model, images=[chart], prompt_tokens=32, seed=i)
            out = model.generate(**inputs, max_new_tokens=16, do_sample=False, num_beams=5)  # MISTAKE
            answers.append(out[0, inputs["input_ids"].shape[1] :].tolist())
    print("answers:", answers)


if __name__ == "__main__":
    main()
