"""The estimator behind ``memwarden.estimate()``: resolve a model from any transformers config (resolve), build and
quantize its meta twin (metamodel), run the request on it (run), turn the trace into a
``MemoryCard`` (card), and sweep grids of models x requests x devices (sweep).
"""
