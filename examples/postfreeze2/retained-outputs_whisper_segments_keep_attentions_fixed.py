"""Long-form Whisper transcription that keeps every window's full generate output (with attentions).

FIXED TWIN: after alignment only the token ids (out.sequences) are kept; the attentions and cache are dropped with the output.

What the user did: ran a streaming/long-form Whisper transcriber that asks ``generate`` for the
cross-attentions (for word alignment / AlignAtt-style emission) and stores each window's output
object in the transcript list. GPU memory "climbs and is full within a couple minutes"; the
maintainer traced it to "cross-attention tensors accumulating unboundedly during decoding". The same
monotonic growth (~650 MB per 30 s chunk) is reported for the transformers.js Whisper pipeline with
word timestamps.

Sources:
- https://github.com/QuentinFuxa/WhisperLiveKit/issues/275 ("After running for more than ten minutes,
  the GPU memory is full" -- "cross-attention tensors accumulating unboundedly during decoding")
- https://github.com/huggingface/transformers.js/issues/1739 ("Whisper ASR pipeline leaks ~650 MB of GPU
  memory per 30 s chunk")
- https://github.com/hyperaudio/hyperaudio-lite-editor/issues/462 ("something is accumulating across
  windows ... DTW over retained cross-attention weights")

Reproduction: a tiny random-weight Whisper (eager attention, so attentions are returned) over a 10 s
window; 5 windows of a recording. Each output carries encoder self-attentions (heads x 500 x 500 per
layer), per-step decoder and cross attentions, and the cache. The word-alignment step only needs the
cross-attentions once, right after generate.
"""

import _common as c
import torch

EXPECT = None

WINDOW_S = 10.0
N_WINDOWS = 5


def align_words(out):
    """Crude DTW stand-in: for each generated token, the encoder frame its cross-attention peaks at."""
    per_step = [torch.stack(step).mean(dim=(0, 2)) for step in out.cross_attentions]  # (B, 1, frames) each
    return [int(s[0, -1].argmax()) for s in per_step]


def main():
    torch.manual_seed(0)
    model = c.whisper(d_model=128, layers=2, vocab=2048, window_s=WINDOW_S, attn="eager")
    recording = c.fake_speech(WINDOW_S * N_WINDOWS)
    hop = int(WINDOW_S * 16000)
    segments, word_frames = [], []
    with torch.inference_mode():
        for w in range(N_WINDOWS):
            feats = c.log_mel(recording[w * hop : (w + 1) * hop], frames=int(WINDOW_S * 100))[None]
            out = model.generate(feats, max_new_tokens=20, return_dict_in_generate=True, output_attentions=True)
            word_frames.append(align_words(out))
            segments.append(out.sequences)
    n_tokens = sum(len(f) for f in word_frames)
    print(f"{len(segments)} windows, {n_tokens} aligned tokens")


if __name__ == "__main__":
    main()
