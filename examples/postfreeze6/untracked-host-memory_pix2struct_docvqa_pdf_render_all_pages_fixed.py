"""Answer a question about every page of a scanned contract with a Pix2Struct DocVQA-style model.

Pages are rasterised the way pdf2image.convert_from_path does (poppler -> PIL images), then each page
is turned into flattened patches and queried.
"""

import numpy as np
import torch
from PIL import Image

import _common as C

EXPECT = None

PDF = "/tmp/heldout6_contract.pdf"
N_PAGES = 40
DPI = 150
MAX_PATCHES = 512


def convert_from_path(pdf_path, dpi=200, first_page=None, last_page=None):
    """Stand-in for pdf2image.convert_from_path: A4 pages rendered at ``dpi`` as RGB PIL images."""
    first, last = first_page or 1, last_page or N_PAGES
    h, w = int(11.69 * dpi), int(8.27 * dpi)
    pages = []
    for p in range(first, last + 1):
        px = np.full((h, w, 3), 255, dtype=np.uint8)
        rng = np.random.default_rng(p)
        rows = rng.integers(0, h - 40, size=60)
        for r in rows:
            px[r : r + 12, 80 : w - 80] = rng.integers(0, 90, size=(12, w - 160, 3), dtype=np.uint8)
        pages.append(Image.fromarray(px))
    return pages


@torch.no_grad()
def ask(model, page, question_ids):
    rgb = np.asarray(page)
    img = C.normalize(rgb)
    fp, mask = C.pix2struct_patches(img, MAX_PATCHES)
    header = torch.tensor([question_ids])  # DocVQA renders the question as a header; we prompt the decoder
    out = model.generate(
        flattened_patches=fp[None],
        attention_mask=mask[None],
        decoder_input_ids=torch.cat([torch.zeros(1, 1, dtype=torch.long), header], 1),
        max_new_tokens=8,
        do_sample=False,
    )
    return out[0, header.shape[1] + 1 :]


def main():
    torch.manual_seed(0)
    model = C.pix2struct(hidden=128, layers=2, vocab=2048)
    question = [C.FIRST_TEXT_ID + (i * 37) % 1800 for i in range(10)]
    pages = (convert_from_path(PDF, dpi=DPI, first_page=p, last_page=p)[0] for p in range(1, N_PAGES + 1))
    found = 0
    for i, page in enumerate(pages):
        ans = ask(model, page, question)
        found += int(ans.numel() > 0)
    print(f"{found} pages answered")


if __name__ == "__main__":
    main()
