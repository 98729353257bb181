"""Fuzz memwarden's commands (not only its loaders) with structured mutations of valid inputs.

    python benchmarks/bench_fuzz_commands.py [--n 10000] [--kinds trace,snapshot,config,thresholds,cli]
        [--seed 0] [--timeout-s 60] [--mem-cap-gib 6] [--json] [--out results.json]

Kinds (``--n`` cases each):

- ``trace``: a valid ``.mwtrace`` mutated at the structure level (a column value set to an extreme or
  out of range, columns reordered, strings/shapes/devices/metadata of the wrong type, NaN/inf/huge
  numbers and deep nesting written into the header's JSON text, duplicated keys, wrong column
  lengths, dtypes and offsets, with the payload checksum fixed up so the mutation reaches past
  it), sometimes also at the byte level. Every case is fed to every subcommand that reads a trace.
- ``snapshot``: a PyTorch memory snapshot mutated at the object level (field types, values,
  shared references, nesting, a ``__reduce__`` payload planted anywhere) and pickled with any
  protocol, sometimes also mutated as bytes; fed to the same subcommands.
- ``config``: a model ``config.json`` mutated field by field, fed to ``memwarden estimate``.
- ``thresholds``: a ``diagnose --config`` thresholds TOML, mutated, fed to ``memwarden diagnose``.
- ``cli``: argument lists of every subcommand, mutated (values replaced with hostile ones, flags
  dropped, duplicated, moved to another subcommand, abbreviated, bad paths).

Each case runs in a forked child (its own process group, ``RLIMIT_AS`` at ``--mem-cap-gib``, stdin
from /dev/null, stdout/stderr to files) that calls ``memwarden.cli.main`` in-process once per
command, so nothing leaks between cases and imports are paid once, in the parent. Per run it
records the exit status, whether an exception escaped ``main`` or ``Traceback`` reached stderr
(a *traceback*), the seconds taken and the peak resident set (``VmHWM``, reset before each run,
so it includes what the preloaded parent already held). A run past ``--timeout-s`` is killed and
counted. Every hostile pickle tries to create a canary file (``os.system``, ``posix.system``,
``builtins.open``, ``subprocess.Popen``, ``exec``); an *execution* is the canary existing after a
case. JSON printed by a ``--json`` run that exited 0 must parse without NaN/Infinity.

Targets: 0 tracebacks, 0 executions, no run over 60 s or over 2 GiB.

The generators and the runner live in ``benchmarks/fuzz_commands/``: one module per input kind
(``traces``, ``snapshots``, ``configs``, ``thresholds``, ``argv``), the shared mutations (``mutate``),
one case's child (``child``) and the driver (``runner``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz_commands import KINDS  # noqa: E402
from fuzz_commands.runner import fuzz, main  # noqa: E402

__all__ = ["KINDS", "fuzz", "main"]

if __name__ == "__main__":
    sys.exit(main())
