"""WhisperX-style transcription + forced alignment with the Whisper model still loaded during alignment.

FIXED TWIN: the pipeline releases the Whisper model (reference dropped, gc.collect()) before the aligner is loaded.

What the user did: transcribed long audio with Whisper and then loaded a wav2vec2 CTC model for word
alignment in the same process. "after the transcription, the Whisper model is not properly GCed ...
so there is just not enough memory for both the Whisper and the alignment model"; the suggested fix is
"not load all models at the same time, and properly GC the whisper model before doing the next
steps: del whisper_model; gc.collect()". Captioning/ASR front-ends (ComfyUI nodes, training GUIs) hit
the same with a "keep model loaded" default.

Sources:
- https://github.com/m-bain/whisperX/issues/89 ("Memory issues" -- Whisper not freed before the alignment
  model is loaded; maintainer: "model flushing now in v3")
- https://github.com/fpgaminer/joycaption_comfyui/pull/20 ("I was running JoyCaption in a loop and
  noticed it wasn't unloading the model" -- an 'offload after generate' option)
- https://github.com/shootthesound/Fizgig/issues/90 (captioning model left in memory slows the next stage)

Reproduction: a random-weight Whisper (256 wide, 4+4 layers, 8k vocabulary, ~34 MB) transcribes a 20 s
clip in two 10 s windows, then a random-weight wav2vec2 CTC model (~16 MB) aligns it. The pipeline
object keeps the ASR model unless told to release it after transcription.
"""

import gc

import _common as c
import torch

EXPECT = None

WINDOW_S = 10.0


class TranscribeAlignPipeline:
    def __init__(self, keep_asr_loaded=True):
        self.keep_asr_loaded = keep_asr_loaded
        self.asr = None
        self.aligner = None

    def transcribe(self, wave):
        if self.asr is None:
            self.asr = c.whisper(d_model=256, layers=4, vocab=8192, window_s=WINDOW_S, seed=1)
        hop = int(WINDOW_S * 16000)
        pieces = []
        with torch.inference_mode():
            for start in range(0, len(wave), hop):
                feats = c.log_mel(wave[start : start + hop], frames=int(WINDOW_S * 100))[None]
                pieces.append(self.asr.generate(feats, max_new_tokens=16)[0])
        if not self.keep_asr_loaded:
            self.asr = None
            gc.collect()
        return torch.cat(pieces)

    def align(self, wave, token_ids):
        if self.aligner is None:
            self.aligner = c.wav2vec2_ctc(hidden=256, layers=4, vocab=64, seed=2)
        with torch.inference_mode():
            emissions = self.aligner(torch.from_numpy(wave)[None]).logits.log_softmax(-1)[0]
        frames = emissions.argmax(-1)
        return [
            (int(t), int(frames[min(i * len(frames) // len(token_ids), len(frames) - 1)]))
            for i, t in enumerate(token_ids)
        ]


def main():
    torch.manual_seed(0)
    wave = c.fake_speech(2 * WINDOW_S)
    pipe = TranscribeAlignPipeline(keep_asr_loaded=False)
    ids = pipe.transcribe(wave)
    words = pipe.align(wave, ids)
    print(f"{len(ids)} tokens transcribed, {len(words)} aligned")


if __name__ == "__main__":
    main()
