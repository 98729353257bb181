"""Loading a fine-tuned Whisper checkpoint saved with torch.save(model.state_dict()).

The service builds the model with random float32 weights, then torch.load()s the whole checkpoint
into RAM and copies it in with load_state_dict: at the peak the process holds the model's own
weights AND a second, complete copy in the state dict.
"""

import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C
import torch

EXPECT = "load-spike"
FIX_WORDS = ["mmap", "assign=true", "meta device"]

MODEL_KW = dict(d_model=768, layers=6, vocab=32000, window_s=10.0)
CKPT = os.path.join(tempfile.gettempdir(), "heldout4_whisper_ft_768x6_10s.pt")


def make_checkpoint():
    """The checkpoint comes from another job; write it in a child process so it does not count here."""
    if os.path.exists(CKPT):
        return
    code = (
        f"import sys, torch; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); import _common as C; "
        f"torch.save(C.whisper(**{MODEL_KW!r}).state_dict(), {CKPT!r})"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def load_finetuned():
    model = C.whisper(**MODEL_KW)
    state = torch.load(CKPT, map_location="cpu")  # MISTAKE
    model.load_state_dict(state)
    return model.eval()


@torch.no_grad()
def transcribe(model):
    mel = C.log_mel(C.fake_speech(5.0), frames=1000).unsqueeze(0)
    return model.generate(input_features=mel, max_new_tokens=4)


def main():
    make_checkpoint()
    model = load_finetuned()
    print(transcribe(model).shape)


if __name__ == "__main__":
    main()
