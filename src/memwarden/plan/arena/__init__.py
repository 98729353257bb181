"""Static arena planning: give every tensor of a trace a fixed offset in one buffer.

If the whole allocation sequence is known in advance (an exported graph, a
fixed-shape inference step), tensors whose lifetimes never overlap can share
memory, and one arena replaces the caching allocator. The strategies are the
offset-calculation heuristics of Pisarchyk & Lee, "Efficient Memory Management
for Deep Neural Net Inference" (arXiv 2001.03288), as implemented in TFLite's
GPU delegate (``tensorflow/lite/delegates/gpu/common/memory_management/``):

- ``greedy-by-size``: records by non-increasing size; each goes into the
  smallest gap between placed records whose lifetimes intersect its own, else
  right after the highest of them.
- ``greedy-by-breadth``: time steps by non-increasing breadth (live bytes); the
  tensors of each step by non-increasing size; the same placement rule.
- ``best``: runs both and keeps the smaller arena, skipping the second when the first
  already reaches the lower bound (ExecuTorch's planner suite keeps the best of several too).

Lifetimes are inclusive trace-row intervals ``[first, last]``: PREEXISTING
counts from row 0, a tensor never freed lives to the last row.

Modules: ``plan`` (``Lifetimes``, ``ArenaPlan``, ``plan_arena`` and the strategies'
orders), ``index`` (the overlap index and its packed spans; its docstring explains what
planning costs) and ``replay`` (``replay_arena``: the plan as an allocator replay).
"""
