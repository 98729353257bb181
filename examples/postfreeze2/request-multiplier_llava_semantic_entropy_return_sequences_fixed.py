"""Semantic-entropy style uncertainty for a LLaVA answer: all samples drawn in one generate call.

FIXED TWIN: the answers are sampled sequentially, one per generate call, as the maintainer suggests.

What the user did: to estimate semantic entropy of a LLaVA-style model's answers to an image question,
asked ``generate`` for many answers at once with ``num_return_sequences`` (plus beams), and a 24 GB
card "could only sample up to 7 answers". ``num_return_sequences`` expands the request into that many
rows (prompt, image, KV cache); the maintainer's answer: "You can always sample sequentially".
In transformers the expansion also repeats ``pixel_values``, so the vision tower runs once per row.

Sources:
- https://github.com/jlko/semantic_uncertainty/issues/5 ("I modified the num_return_sequences parameter
  to sample multiple answers ... I encountered an out-of-memory issue, as 24 GB of VRAM could only
  sample up to 7 answers")
- https://github.com/huggingface/transformers/issues/10240 ("By setting num_return_sequences you're
  creating bigger batches, so it is expected to have an OOM")

Reproduction: a tiny random-weight LLaVA (256 image tokens per 128 px image), 10 sampled answers of
16 tokens each for one image question.
"""

import _common as c
import torch

EXPECT = None

N_SAMPLES = 10


def sample_answers(model, inputs, n, per_call, **gen):
    answers = []
    while len(answers) < n:
        out = model.generate(**inputs, num_return_sequences=per_call, do_sample=True, temperature=1.0, **gen)
        answers.extend(out[:, inputs["input_ids"].shape[1] :])
    return answers[:n]


def entropy_of_clusters(answers):
    firsts = torch.stack([a[0] for a in answers])
    _, counts = firsts.unique(return_counts=True)
    p = counts.float() / counts.sum()
    return float(-(p * p.log()).sum())


def main():
    torch.manual_seed(0)
    model = c.llava(image_px=128, patch_px=8, vision_hidden=96, vision_layers=2, hidden=128, layers=2, vocab=8192)
    ids = c.llava_prompt(model, n_images=1, prompt_tokens=40, seed=4)
    inputs = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "pixel_values": c.normalize(c.fake_rgb(128, 128, seed=9))[None],
    }
    with torch.inference_mode():
        per_call = 1
        answers = sample_answers(
            model, inputs, N_SAMPLES, per_call, max_new_tokens=16, pad_token_id=c.PAD_ID, eos_token_id=None
        )
    print(f"{len(answers)} answers, first-token entropy {entropy_of_clusters(answers):.3f}")


if __name__ == "__main__":
    main()
