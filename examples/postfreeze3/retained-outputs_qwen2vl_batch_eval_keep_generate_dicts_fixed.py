"""Fixed twin: each image keeps its answer ids and the chosen tokens' log-probabilities only.

What the user did: to score answers by their token probabilities, the user calls
``generate(..., return_dict_in_generate=True, output_scores=True)`` for every benchmark image and
appends the returned object to a list that is post-processed after the loop. Each object holds the
per-step full-vocabulary scores and, with ``return_dict_in_generate``, the request's KV cache, so
every image's cache and scores stay alive for the whole run.
Answer in the source: with ``return_dict_in_generate=True`` the cache is part of the output; keep
what is needed (the ``sequences``, or the chosen-token scores) and let the rest go, instead of the
whole output.
Sources: https://github.com/huggingface/transformers/issues/24841 ; https://github.com/QwenLM/Qwen3-VL/issues/334
Reproduction: a tiny random-weight Qwen2-VL (4 layers, 32k vocabulary); 10 decoded images of 336x448
(192 image tokens) each get a 16-token answer; the chosen-token log-probabilities and the
``sequences`` are taken right away and the output dict is dropped.
"""

import _common as c
import torch

EXPECT = None

N_IMAGES = 10


def main() -> None:
    model = c.qwen_vl("qwen2-vl", hidden=256, layers=4, vocab=32000, kv_heads=4, vision_hidden=32)
    results = []
    with torch.inference_mode():
        for i in range(N_IMAGES):
            image = c.normalize(c.fake_rgb(336, 448, seed=i))
            inputs = c.qwen_inputs(model, images=[image], prompt_tokens=40, seed=i)
            out = model.generate(
                **inputs, max_new_tokens=16, do_sample=False, return_dict_in_generate=True, output_scores=True
            )
            steps = torch.stack(out.scores, dim=1).log_softmax(-1)
            chosen = out.sequences[:, -steps.shape[1] :]
            results.append((out.sequences, steps.gather(-1, chosen.unsqueeze(-1)).sum()))
            del out, steps
    logprobs = [float(lp) for _, lp in results]
    print("answer log-probs:", [round(x, 2) for x in logprobs])


if __name__ == "__main__":
    main()
