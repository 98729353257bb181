"""SAM interactive segmentation done as the model docs show it: the image embedding of one photo is
computed once with get_image_embeddings and passed as image_embeddings= for each of 24 clicks;
only the thresholded masks are kept."""

import torch

import _common as C

EXPECT = None

model = C.sam(image_px=384, patch_px=16, hidden=64, layers=2, out_channels=128)

if __name__ == "__main__":
    rgb = C.fake_rgb(480, 640, seed=5)
    with torch.no_grad():
        x = C.resize(C.normalize(rgb).unsqueeze(0), 384, 384)
        emb = model.get_image_embeddings(x)
        emb = emb if torch.is_tensor(emb) else emb[0]
        masks = []
        for k in range(24):
            pts = torch.tensor([[[[20.0 + 10 * k, 40.0 + 5 * k]]]])
            out = model(
                image_embeddings=emb,
                input_points=pts,
                input_labels=torch.ones(1, 1, 1, dtype=torch.long),
                multimask_output=False,
            )
            masks.append((out.pred_masks[0, 0, 0] > 0).clone())
    print("masks:", len(masks), tuple(masks[0].shape))
