"""ONNX Runtime capture: a Trace of an ORT session run, and exporting the zoo to ONNX.

- ``memwarden.capture.onnx.capture``: ``capture_onnx(session_or_path, feeds)``, the entry point.
- ``memwarden.capture.onnx.session``: settings (EP, arena, memory pattern), feeds, the profiled run.
- ``memwarden.capture.onnx.twin``: the arena-on twin of an arena-off run, on an arena that splits every chunk.
- ``memwarden.capture.onnx.profile``: ORT's profiling JSON, read into per-node records.
- ``memwarden.capture.onnx.graph``: the ONNX graph (consumers, initializers, module paths).
- ``memwarden.capture.onnx.build``: lifetimes as ORT's CPU allocation planner gives them.
- ``memwarden.capture.onnx.pattern``: ORT's memory-pattern planner, replayed over a run's plan.
- ``memwarden.capture.onnx.measure``: the independent check (a preloaded malloc counter, ``mallocpeak``;
  ORT's allocator counters, memray where installed, RSS).
- ``memwarden.capture.onnx.export``: zoo VLM parts (vision + projector, prefill, decode) to ONNX.
"""
