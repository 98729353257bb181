"""Fixed twin: the handler is decorated with `@torch.no_grad()`.

What the user did: a web demo answers multiple-choice questions about an uploaded image by scoring
each option with a forward pass (the last-position logits of the prompt) and stores the per-option
score tensors in the session history so the UI can show them later. The handler is a plain function
with no ``torch.no_grad()``: every forward builds an autograd graph, and the stored score tensors
keep each request's graph, with all of its saved activations, alive for the session.
Answer in the source: add ``torch.no_grad()`` around the chat/forward call in the web demo (without
it the demo holds memory "as in training"); the fix was applied to the demo.
Sources: https://github.com/zai-org/CogVLM/issues/18 ; https://github.com/huggingface/transformers/issues/18629
Reproduction: a tiny random-weight LLaVA (336-style 24x24 grid, 576 image tokens); 6 requests, each
scoring 4 options in one batch under ``torch.no_grad()``; the score tensors carry no graph.
"""

import _common as c
import torch

EXPECT = None


@torch.no_grad()
def handle_request(model, session: list, image: torch.Tensor, options: list[list[int]]):
    """Score every answer option for the uploaded image; remember the scores for the UI."""
    base = c.llava_prompt(model, n_images=1, prompt_tokens=24, seed=len(session))
    ids = torch.cat([torch.cat([base[0], torch.tensor(o)]).unsqueeze(0) for o in options])
    pixel_values = image.unsqueeze(0).expand(len(options), -1, -1, -1)
    logits = model(
        input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixel_values, logits_to_keep=1
    ).logits
    scores = logits[:, -1].log_softmax(-1)[:, 5]
    session.append({"scores": scores, "best": int(scores.argmax())})
    return session[-1]["best"]


def main() -> None:
    model = c.llava(image_px=192, patch_px=8, vision_hidden=64, hidden=128, layers=2, vocab=4096)
    session: list = []
    for r in range(6):
        image = torch.rand(3, 192, 192).sub_(0.5).div_(0.25)
        options = [c.text_ids(6, 4000, seed=10 * r + k)[0].tolist() for k in range(4)]
        handle_request(model, session, image, options)
    print("answers:", [h["best"] for h in session])


if __name__ == "__main__":
    main()
