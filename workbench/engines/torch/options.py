"""The torch engine's opt-in variants (`compile`, `quantize`): their names and their command-line flags.

One place for what `workbench serve` and `workbench microbench` accept and for the name a variant
runs under (its series in tables and figures); no torch import, so the CLI stays light. In a bench
YAML the same options go in the engine entry: `{name: torch, options: {compile: true}}`,
`{name: torch, dtype: float32, options: {quantize: int8}, label: torch-int8}`.
"""

from __future__ import annotations

import argparse

QUANTIZE_MODES = ("int8",)
VARIANT_OPTIONS = ("compile", "quantize")  # the engine options these flags set (serve's command line carries them)


def variant_name(compiled: bool, quantize: str | None) -> str:
    """torch, torch-int8, torch-compiled or torch-int8-compiled: the engine's name with these options."""
    return "-".join(["torch", *([quantize] if quantize else []), *(["compiled"] if compiled else [])])


def add_flags(parser: argparse.ArgumentParser) -> None:
    """`--compile` and `--quantize int8` on `parser`."""
    parser.add_argument("--compile", action="store_true",
                        help="torch engine: fuse the per-layer elementwise work with torch.compile (compiled at "
                             "start-up; eager with a warning where that fails)")
    parser.add_argument("--quantize", choices=QUANTIZE_MODES, default=None,
                        help="torch engine: dynamic int8 layer GEMMs (float32 activations: needs --dtype float32)")


def from_args(args: argparse.Namespace, engine: str = "torch") -> dict:
    """The engine options the flags ask for, {} when none (so an engine never sees a knob it lacks); a flag
    given for another engine is a usage error."""
    from workbench.errors import UsageError

    opts = {**({"compile": True} if args.compile else {}), **({"quantize": args.quantize} if args.quantize else {})}
    if opts and engine != "torch":
        raise UsageError(f"--compile and --quantize are torch engine options, not {engine}'s; use --engine torch")
    return opts
