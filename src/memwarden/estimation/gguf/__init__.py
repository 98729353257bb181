"""llama.cpp deployments (a GGUF language model, optionally an ``mmproj`` GGUF projector) estimated
from the files' headers with llama.cpp's own allocation rules: ``reader`` (the bounded header
parser), ``hparams`` (what the loader reads from the metadata), ``buffers`` (model, KV and compute
buffers), ``mmproj`` (the projector: weights, image tokens, its compute buffer) and ``estimate``
(the figures together, their placement and the verdict)."""
