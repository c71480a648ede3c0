"""`workbench` command line: run | validate | serve | microbench | bench | report | engines.

Each subcommand imports its module only when called, so `workbench validate` stays instant and
never imports torch or an engine backend.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _cmd_validate(args) -> int:
    from workbench.config import ConfigError, StudyConfig, load_config

    ok = True
    for f in args.files:
        try:
            cfg = load_config(f)
            if isinstance(cfg, StudyConfig):
                what = f"dataset {cfg.dataset.name}, stages {', '.join(cfg.stages)}; run: workbench run {f}"
            else:
                what = f"{cfg.load.workload} on {', '.join(e.label or e.name for e in cfg.engines)}; run: workbench bench {f}"
            print(f"ok: {f} ({type(cfg).__name__} {cfg.name!r}: {what})")
        except ConfigError as e:
            ok = False
            print(e, file=sys.stderr)
    return 0 if ok else 2


def _cmd_run(args) -> int:
    from workbench.config import load_study
    from workbench.study.pipeline import run_experiment

    # --methods narrows methods.run: trained models are cached per method (the key ignores the list), so two
    # processes can train disjoint methods side by side and a plain run afterwards reuses both
    cfg = load_study(args.file, overrides={"methods": {"run": args.methods}} if args.methods else None)
    run_experiment(cfg, experiment_file=args.file, stages=args.stages)
    return 0


def _cmd_serve(args) -> int:
    from workbench.engines.server import serve

    serve(
        checkpoint=args.checkpoint,
        engine=args.engine,
        host=args.host,
        port=args.port,
        dtype=args.dtype,
    )
    return 0


def _cmd_microbench(args) -> int:
    from workbench.perf.microbench import main as microbench_main

    return microbench_main(args.rest)


def _cmd_bench(args) -> int:
    from workbench.config import load_sweep
    from workbench.load.bench import run_bench

    run_bench(load_sweep(args.file), experiment_file=args.file)
    return 0


def _cmd_report(args) -> int:
    from workbench.report.html import write_report

    out = write_report(args.experiment, Path(args.output), latest=args.latest)
    print(f"report written to {out}")
    return 0


def _cmd_engines(args) -> int:
    from workbench.engines import registry

    if args.action == "list":
        print(registry.capability_table_markdown())
        return 0
    if args.action == "launch":
        from workbench.engines.launcher import launch_cli

        return launch_cli(args.name, args.checkpoint, dtype=args.dtype)
    if args.action == "validate":
        from workbench.engines.launcher import validate_cli

        return validate_cli(args.name, args.checkpoint)
    raise AssertionError(args.action)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description="Serving study for generative recommenders.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("validate", help="check experiment YAML files without running anything")
    s.add_argument("files", nargs="+")
    s.set_defaults(func=_cmd_validate)

    s = sub.add_parser("run", help="run a study file's stages (data, embeddings, SIDs, train, evaluate)")
    s.add_argument("file")
    s.add_argument("--stages", nargs="*", default=None, help="run only these stages (default: the config's)")
    s.add_argument("--methods", nargs="+", default=None,
                   help="run only these methods (overrides methods.run; e.g. to train methods in parallel processes)")
    s.set_defaults(func=_cmd_run)

    s = sub.add_parser("serve", help="serve a checkpoint with an in-process engine over HTTP")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("--engine", default="torch", choices=["torch", "hf"])
    s.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    s.add_argument("--port", type=int, default=8100)
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    s.set_defaults(func=_cmd_serve)

    s = sub.add_parser("microbench", help="torch engine vs hf baseline, side by side (prints ratios)")
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(func=_cmd_microbench)

    s = sub.add_parser("bench", help="run a load-sweep file (latency vs QPS, saturation, cost)")
    s.add_argument("file")
    s.set_defaults(func=_cmd_bench)

    s = sub.add_parser("report", help="write a standalone HTML report of MLflow experiment(s)")
    s.add_argument("--experiment", required=True,
                   help="a name, or several comma-separated (a load sweep and the study whose quality it joins)")
    s.add_argument("-o", "--output", required=True)
    s.add_argument("--latest", action="store_true",
                   help="only the most recent load sweep of each experiment (a re-run sweep otherwise shows twice)")
    s.set_defaults(func=_cmd_report)

    s = sub.add_parser("engines", help="engine capability matrix, launch or validate an engine server")
    s.add_argument("action", choices=["list", "launch", "validate"])
    s.add_argument("name", nargs="?", default=None)
    s.add_argument("--checkpoint", default=None)
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    s.set_defaults(func=_cmd_engines)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["microbench"]:  # forwards its own flags (argparse REMAINDER misses leading --flags)
        from workbench.perf.microbench import main as microbench_main

        return microbench_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - CLI boundary: one clear line, not a traceback wall
        from workbench.config import ConfigError

        if isinstance(e, ConfigError):
            print(e, file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
