"""ONNX Runtime capture: a Trace of an ORT session run, and exporting the zoo to ONNX.

- ``memwarden.record.onnx.capture``: ``capture_onnx(session_or_path, feeds)``, the entry point.
- ``memwarden.record.onnx.session``: settings (EP, arena, memory pattern), feeds, the profiled run.
- ``memwarden.record.onnx.twin``: the arena-on twin of an arena-off run, on an arena that splits every chunk.
- ``memwarden.record.onnx.profile``: ORT's profiling JSON, read into per-node records.
- ``memwarden.record.onnx.graph``: the ONNX graph (consumers, initializers, module paths).
- ``memwarden.record.onnx.build``: lifetimes as ORT's CPU allocation planner gives them.
- ``memwarden.record.onnx.pattern``: ORT's memory-pattern planner, replayed over a run's plan.
- ``memwarden.record.onnx.measure``: the independent check (a preloaded malloc counter, ``mallocpeak``;
  ORT's allocator counters, memray where installed, RSS).
- ``memwarden.record.onnx.export``: zoo VLM parts (vision + projector, prefill, decode) to ONNX.
"""
