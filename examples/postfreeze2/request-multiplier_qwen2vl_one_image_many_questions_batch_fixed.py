"""Several questions about one photo answered as a batch that repeats the photo once per question.

FIXED TWIN: the questions are asked one at a time, so only one copy of the image request is alive.

What the user did: needed one definite answer per prompt for a single input image with Qwen2.5-VL and
batched it the obvious way -- one conversation per question, each carrying the same image -- so the
batch holds the image's pixels and visual tokens once per question (the vision tower encodes it N
times and the KV cache stores N copies). BLIP users asking "more than 1 question simultaneously" were
told to ask one by one with the image prepared once; LAVIS's generate repeats one prompt per image.

Sources:
- https://github.com/QwenLM/Qwen3-VL/issues/704 ("Single image multiple prompts answering ... I used to
  generate the answers sequentially (1 prompt = 1 conversation for the same image)")
- https://github.com/salesforce/BLIP/issues/78 ("can I ask multiple questions about the same image ...
  (run the model only once)?" -- answer: load the image once and loop over the questions)
- https://github.com/salesforce/LAVIS/issues/100 (``prompt = [prompt]*image.size(0)`` in BLIP-2 generate)

Reproduction: a tiny random-weight Qwen2-VL, one 448x336 photo (192 merged visual tokens), 8 questions
of equal length. The planted run stacks 8 copies of the image request; the twin asks the
questions one at a time (one image request alive at once).
"""

import _common as c
import torch

EXPECT = None

QUESTIONS = [f"question {i}: what is the colour of object number {i} on the shelf ?" for i in range(8)]


def encode_turn(model, image, question):
    vocab = model.config.get_text_config().vocab_size
    q = c.tokenize(question, vocab - 4)
    return c.qwen_inputs(model, images=[image], prompt_tokens=4, text_after=q)


def stack_requests(reqs):
    out = {
        k: torch.cat([r[k] for r in reqs], dim=0)
        for k in ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw")
    }
    return out


def answer(model, questions, image, batch_size):
    answers = []
    for i in range(0, len(questions), batch_size):
        req = stack_requests([encode_turn(model, image, q) for q in questions[i : i + batch_size]])
        out = model.generate(**req, max_new_tokens=16, do_sample=False, pad_token_id=c.PAD_ID, eos_token_id=None)
        answers.extend(out[:, req["input_ids"].shape[1] :])
    return answers


def main():
    torch.manual_seed(0)
    model = c.qwen_vl("qwen2-vl", vision_hidden=64, vision_layers=2, hidden=128, layers=2, vocab=8192)
    photo = c.normalize(c.fake_rgb(336, 448, seed=11))
    with torch.inference_mode():
        answers = answer(model, QUESTIONS, photo, batch_size=1)
    print(f"{len(answers)} answers of {len(answers[0])} tokens")


if __name__ == "__main__":
    main()
