"""Correct library path: transcribing a long recording with a Qwen2-Audio-style model one encoder
window at a time, under ``torch.no_grad()``, keeping only the generated token ids of each chunk.

Source: https://github.com/huggingface/transformers/issues/27834 — "Whisper v-3 pipeline requiring
a lot of memory when setting return_timestamps="word"" (the extra memory comes from the attention
outputs that word timestamps need); https://github.com/huggingface/transformers/pull/33732 drops
those weights when they are not requested. Plain chunked generation, as here, keeps none of them.

The loop looks like it could accumulate, but each chunk's request, cache and output go out of
scope before the next one; the transcript is a list of small integer lists.
"""

import _common as c
import torch

from memwarden.models import zoo

EXPECT = None

CHUNKS = 6


def main() -> None:
    torch.manual_seed(0)
    model = c.qwen2_audio(window_s=6.0, hidden=128, layers=2, vocab=4096)
    gen = zoo.generate_kwargs("qwen2-audio")
    transcript: list[list[int]] = []
    with torch.no_grad():
        for chunk in range(CHUNKS):
            inputs = zoo.make_inputs(
                model, audio_seconds=6.0 if chunk < CHUNKS - 1 else 2.5, prompt_tokens=12, seed=chunk
            )
            out = model.generate(**inputs, max_new_tokens=10, **gen)
            transcript.append(out[0, inputs["input_ids"].shape[1] :].tolist())
    print(f"{len(transcript)} chunks, {sum(map(len, transcript))} tokens")


if __name__ == "__main__":
    main()
