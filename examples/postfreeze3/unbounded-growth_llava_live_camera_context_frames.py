"""Live-camera captioner whose "recent frames" context list is never trimmed.

What the user did: a service watches a camera and emits a short caption per frame in the context
of the frames before it. The image features of every frame are appended to ``context`` and the
prompt uses the last 2 of them, but nothing ever removes old entries: the list (each entry a
256-token feature map) grows for as long as the stream runs.
Answer in the source: bound what a long-running session retains (a fixed window of recent frames /
a ``max_history_size`` or circular buffer), since a session that keeps everything it has seen grows
without bound; clearing the history is what stops the growth in the chat demo.
Sources: https://github.com/vllm-project/vllm/issues/51948 ; https://github.com/zai-org/ChatGLM3/issues/101 ;
https://github.com/barun-saha/kodeagent/issues/97
Reproduction: a tiny random-weight LLaVA (256 image tokens, 256-wide projector); 40 camera frames;
each frame's projected features are appended to ``context`` and a 4-token caption is generated from
the last 2 frames' features.
"""

import _common as c
import torch

EXPECT = "unbounded-growth"
FIX_WORDS = ("maxlen", "deque", "bound", "max_history")

WINDOW = 2
N_FRAMES = 40


def caption(model, feats: list[torch.Tensor], seed: int) -> list[int]:
    """Generate from the features of the window's frames spliced at the image placeholders."""
    ids = c.llava_prompt(model, n_images=len(feats), prompt_tokens=16, seed=seed)
    embeds = model.get_input_embeddings()(ids)
    mask = ids == model.config.image_token_id
    embeds[mask] = torch.cat(feats).to(embeds.dtype)
    out = model.generate(inputs_embeds=embeds, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False)
    return out[0].tolist()


def main() -> None:
    model = c.llava(image_px=128, patch_px=8, vision_hidden=32, hidden=256, layers=2, vocab=4096)
    context = []  # MISTAKE
    captions = []
    with torch.inference_mode():
        for t in range(N_FRAMES):
            frame = torch.rand(1, 3, 128, 128).sub_(0.5).div_(0.25)
            feats = torch.cat(list(model.get_image_features(pixel_values=frame).pooler_output))
            context.append(feats.reshape(-1, feats.shape[-1]))
            window = list(context)[-WINDOW:]
            captions.append(caption(model, window, seed=t))
    print(f"{len(captions)} captions; context holds {len(context)} frames")


if __name__ == "__main__":
    main()
