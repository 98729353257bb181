"""Long recording transcribed with Whisper in fixed windows, batched, keeping only token ids.

What the user does: what the Whisper model cards describe for long-form audio -- cut the recording
into windows of the encoder's length ("Chunking is enabled by setting chunk_length_s=30"), run them
"with batched inference", and keep the decoded ids. Memory is one batch of windows (encoder states,
cross-attention cache) -- proportional to batch size, bounded, and intended.

Sources:
- https://huggingface.co/openai/whisper-large-v2/commit/1f66457e6e36eeb6d89078882a39003e55c330b8
  ("The Whisper model is intrinsically designed to work on audio samples of up to 30s ... Chunking is
  enabled by setting chunk_length_s=30 ... With chunking enabled, the pipeline can be run with batched
  inference")
- https://huggingface.co/Val123val/ru_whisper_small/commit/95e89a5ff9b00403afbca46f5f72edc47894979f
  (``pipe(sample.copy(), batch_size=8)``)

Reproduction: a tiny random-weight Whisper with a 10 s window; a 60 s recording in 6 windows
transcribed as one batch of 6, 24 tokens each.
"""

import _common as c
import torch

EXPECT = None

WINDOW_S, N_WINDOWS = 10.0, 6


def main():
    torch.manual_seed(0)
    model = c.whisper(d_model=128, layers=2, vocab=2048, window_s=WINDOW_S)
    recording = c.fake_speech(WINDOW_S * N_WINDOWS, seed=4)
    hop = int(WINDOW_S * 16000)
    feats = torch.stack(
        [c.log_mel(recording[k * hop : (k + 1) * hop], frames=int(WINDOW_S * 100)) for k in range(N_WINDOWS)]
    )
    with torch.inference_mode():
        ids = model.generate(feats, max_new_tokens=24)
    transcript = [row.tolist() for row in ids]
    print(f"{len(transcript)} windows, {sum(len(t) for t in transcript)} tokens")


if __name__ == "__main__":
    main()
