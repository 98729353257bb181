"""Attribution: a capture's raw log (the allocator recorder's rows, module-call markers, steps
and the Python side's tags) becomes a Trace, in named stages, each a function of plain data:

  log        what the Python side saw during the run (``CaptureLog``), cheap to fill
  recorded   the recorder's drained columns and the blocks (one per ALLOC) they hold
  spans      module-call spans from the ENTER/EXIT markers; each row's innermost open call
  phases     the steps (root calls) and the phase of every block
  categories temporary vs activation, by the lifetime of the call that made a block
  tags       parameters, gradients, optimizer state, KV cache and inputs, matched to blocks
  emit       the trace's event columns and rows (``emit_events``) and its spans and steps
             (``emit_spans``)
  attributor the pipeline: ``Attributor.build`` runs the stages in order

Rules (in priority order):
  category  weight/buffer (storage of a parameter/buffer) > optimizer_state >
            gradient > kv_cache (in a root call's past_key_values) > input
            (passed into a root call, made outside any module) > temporary
            (freed before the module call that made it returned) > activation
            (made inside a module, outlived its call) > other.
  phase     optimizer (inside optimizer.step) > backward (made by the autograd
            engine) > encode (inside a vision/audio/fusion module) > the phase
            of the root call (step) it falls in or follows (prefill/decode) >
            load (before the first root call).
  modality  from the capture's module path rules, for a block made inside a module and for
            a parameter alike; kv_cache is text.
"""
