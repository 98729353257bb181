import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""Speaker enrollment for a voice-login demo with a wav2vec2 base encoder: every enrollment
utterance is run with output_hidden_states=True because layer 6 works best for speaker identity.
The extractor mean-pools the chosen layer right away and keeps one vector per utterance."""

import torch

EXPECT = None

LAYER = 4
SR = 16000


class SpeakerFeatureExtractor:
    def __init__(self, encoder):
        self.encoder = encoder
        self.outputs = {}

    @torch.no_grad()
    def process(self, utt_id, wave):
        x = torch.from_numpy(wave).unsqueeze(0)
        out = self.encoder(x, output_hidden_states=True)
        self.outputs[utt_id] = out.hidden_states[LAYER].mean(1)[0]

    def speaker_embeddings(self):
        by_speaker = {}
        for utt_id, out in self.outputs.items():
            spk = utt_id.split("/")[0]
            by_speaker.setdefault(spk, []).append(out)
        return {spk: torch.stack(v).mean(0) for spk, v in by_speaker.items()}


def main():
    torch.manual_seed(0)
    encoder = C.wav2vec2_classifier(hidden=256, layers=6).wav2vec2.eval()
    extractor = SpeakerFeatureExtractor(encoder)
    for spk in range(6):
        for take in range(4):
            extractor.process(f"spk{spk:02d}/take{take}", C.fake_speech(4.0, seed=100 * spk + take))
    emb = extractor.speaker_embeddings()
    print("enrolled speakers:", len(emb), "dim:", next(iter(emb.values())).shape[0])


if __name__ == "__main__":
    main()
