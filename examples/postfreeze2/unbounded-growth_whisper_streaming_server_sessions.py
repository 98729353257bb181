"""A streaming Whisper transcription server whose per-connection state outlives the connection.

What the user did: ran a WebSocket real-time transcription server (WhisperLiveKit-style). "There was
no problem when linking for the first time, but a few minutes after transcription, the gpu's video
memory began to increase. This situation will occur when the second link is disconnected"; other
users see memory climb until the card is full. Per-connection buffers (audio, encoder states kept for
the streaming policy) are only released if the disconnect handler removes them.

Sources:
- https://github.com/QuentinFuxa/WhisperLiveKit/issues/311 ("when the second link is disconnected"
  memory keeps increasing)
- https://github.com/QuentinFuxa/WhisperLiveKit/issues/275 ("After running for more than ten minutes,
  the GPU memory is full")
- https://github.com/SYSTRAN/faster-whisper/issues/1055 ("When transcribing ... in parallel, the memory
  usage keeps increasing until OOM, even if garbage collected manually")

Reproduction: a tiny random-weight Whisper over 5 s windows; 12 short connections each stream 3
one-second chunks. A session keeps its raw audio, each chunk's log-mel window (80 x 500) and encoder
output (250 x 128) for the alignment policy, ~1 MB per connection. ``on_close`` marks the session finished but leaves
it in the server's dict.
"""

import _common as c
import numpy as np
import torch
from transformers.modeling_outputs import BaseModelOutput

EXPECT = "unbounded-growth"
FIX_WORDS = ("pop", "del", "remove", "evict", "on_close", "bound")

WINDOW_S = 5.0


class StreamingServer:
    def __init__(self, model):
        self.model = model
        self.sessions = {}

    def on_open(self, sid):
        self.sessions[sid] = {"audio": [], "mel": [], "encoder_states": [], "text": [], "closed": False}

    @torch.inference_mode()
    def on_chunk(self, sid, pcm):
        s = self.sessions[sid]
        s["audio"].append(pcm)
        wave = np.concatenate(s["audio"])
        mel = c.log_mel(wave, frames=int(WINDOW_S * 100))[None]
        s["mel"].append(mel)
        enc = self.model.model.encoder(mel).last_hidden_state
        s["encoder_states"].append(enc)
        prompt = torch.tensor([[c.BOS_ID] + s["text"][-8:]])
        logits = self.model(encoder_outputs=BaseModelOutput(last_hidden_state=enc), decoder_input_ids=prompt).logits
        s["text"].append(int(logits[0, -1].argmax()))
        return s["text"][-1]

    def on_close(self, sid):
        self.sessions[sid]["closed"] = True  # MISTAKE


def main():
    torch.manual_seed(0)
    server = StreamingServer(c.whisper(d_model=128, layers=2, vocab=2048, window_s=WINDOW_S))
    for conn in range(12):
        sid = f"ws-{conn}"
        server.on_open(sid)
        speech = c.fake_speech(3.0, seed=conn)
        for k in range(3):
            server.on_chunk(sid, speech[k * 16000 : (k + 1) * 16000])
        server.on_close(sid)
    live = sum(not s["closed"] for s in server.sessions.values())
    print(f"served 12 connections; {len(server.sessions)} sessions in memory, {live} open")


if __name__ == "__main__":
    main()
