"""`workbench` command line: run | validate | data | serve | soak | microbench | trainbench | variant-quality | bench |
report | engines.

Each subcommand imports its module only when called, so `workbench validate` stays instant and
never imports torch or an engine backend.

A mistake the user can fix (a bad experiment file, flag, checkpoint folder or port: any
`workbench.errors.UsageError`) prints what is wrong and how to fix it in a line or two and exits 2;
`--debug` (before or after the subcommand) prints the traceback as well. Any other exception is a
bug and keeps its traceback (exit 1).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from workbench import names
from workbench.errors import UsageError


def _cmd_validate(args) -> int:
    """Check every file (a bad one does not hide the next one's problem); 2 if any failed."""
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
            print(f"error: {e}", file=sys.stderr, flush=True)
    return 0 if ok else 2


def _cmd_data(args) -> int:
    """`data check FILE`: read, validate and summarize the study's dataset; `data prepare FILE`: the same, and say
    where the prepared tables are cached (the data stage reads them from there)."""
    from workbench.config import load_study

    cfg = load_study(args.file)  # a bad file fails before any data is read
    from workbench.data.check import prepare, summary

    prep, note = prepare(cfg)
    print(summary(prep, note))
    if args.action == "prepare":
        from workbench.data.readers import read_key
        from workbench.paths import cache_dir, data_dir

        d = cfg.dataset
        where = cache_dir("dataset", read_key(d)) if d.interactions else data_dir() / d.name  # movielens.py
        print(f"prepared: {where}")
    return 0


def _tracking_override(args) -> dict:
    """`--tracking-uri` as a config override: it then wins over the file's `tracking.uri` through the same
    path (`tracking.use` in run_experiment / run_bench), and is validated like the key."""
    return {"tracking": {"uri": args.tracking_uri}} if args.tracking_uri else {}


def _cmd_run(args) -> int:
    from workbench.config import load_study
    from workbench.study.outputs import resolve_stages, run_experiment

    if args.stages:
        resolve_stages(args.stages)  # a misspelt --stages fails before the config loads or MLflow starts

    # --methods narrows methods.run: trained models are cached per method (the key ignores the list), so two
    # processes can train disjoint methods side by side and a plain run afterwards reuses both; its names are all
    # that runs (a context variant by its name, none-k5: methods.contexts is set aside)
    # --seeds narrows training.seeds the same way (the train key ignores the seed list too)
    overrides: dict = {}
    if args.methods:
        overrides["methods"] = {"run": args.methods}
    if args.seeds:
        overrides["training"] = {"seeds": args.seeds}
    overrides.update(_tracking_override(args))
    cfg = load_study(args.file, overrides=overrides or None)
    if args.methods and cfg.methods.contexts:  # a merge cannot empty a mapping: set aside here
        cfg = cfg.model_copy(update={"methods": cfg.methods.model_copy(update={"contexts": {}})})
    from workbench import dist

    if not dist.world().is_main:  # under torchrun (joins the ranks here): one console, rank 0's; errors still show
        sys.stdout = open(os.devnull, "w")
    run_experiment(cfg, experiment_file=args.file, stages=args.stages)
    return 0


def _cmd_serve(args) -> int:
    from workbench.engines.torch import options as torch_options
    from workbench.engines.serving.serve import serve

    serve(
        checkpoint=args.checkpoint,
        engine=args.engine,
        host=args.host,
        port=args.port,
        dtype=args.dtype,
        device=args.device,
        **torch_options.from_args(args, args.engine),
    )
    return 0


def _cmd_soak(args) -> int:
    from workbench.load.soak import main

    return main(args)


# subcommands that parse their own flags (argparse REMAINDER misses leading --flags): name -> module with main(argv)
_FORWARDED = {"microbench": "workbench.perf.microbench", "variant-quality": "workbench.perf.variant_quality",
              "trainbench": "workbench.perf.trainbench"}


def _forwarded(name: str, rest: list[str]):
    """The `func` of a forwarded subcommand: its module's own `main(rest)`."""

    def run(args) -> int:
        import importlib

        return importlib.import_module(_FORWARDED[name]).main(rest)

    return run


def _cmd_bench(args) -> int:
    from workbench.config import load_sweep

    cfg = load_sweep(args.file, overrides=_tracking_override(args) or None)  # a bad file fails before heavy imports
    from workbench.load.bench import run_bench

    run_bench(cfg, experiment_file=args.file)
    return 0


def _cmd_report(args) -> int:
    from workbench import tracking
    from workbench.report.html import write_report

    if args.png:
        from workbench.report import picture

        why = picture.missing()  # before reading the runs: that can take a while
        if why:
            raise picture.PictureError(f"--png needs a browser: {why}")
    with tracking.use(args.tracking_uri):  # no config here: the flag, else MLFLOW_TRACKING_URI, else local
        out = write_report(args.experiment, Path(args.output), latest=args.latest)
    print(f"report written to {out}")
    if args.png:
        print(f"picture written to {picture.write_png(out, Path(args.png))}")
    return 0


def _cmd_engines(args) -> int:
    from workbench.engines import registry

    if args.action == "list":
        print(registry.capability_table_markdown())
        return 0
    if args.action == "launch":
        from workbench.engines.remote.launcher import launch_cli

        return launch_cli(args.name, args.checkpoint, dtype=args.dtype)
    if args.action == "validate":
        from workbench.engines.parity import validate_cli

        return validate_cli(args.name, args.checkpoint, dtype=args.dtype)
    raise AssertionError(args.action)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description="Serving study for generative recommenders.")
    debug_help = "on a usage error (bad file, flag, checkpoint, port), print the full traceback too"
    p.add_argument("--debug", action="store_true", help=debug_help)
    # the same flag after the subcommand; SUPPRESS: a subcommand without it leaves the global value alone
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument("--tracking-uri", default=None, metavar="URI",
                       help="MLflow store, e.g. a team server http://host:5000 (wins over the file's tracking.uri "
                            "and MLFLOW_TRACKING_URI; default: those, else the local sqlite store under mlruns/)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("validate", parents=[common], help="check experiment YAML files without running anything")
    s.add_argument("files", nargs="+")
    s.set_defaults(func=_cmd_validate)

    s = sub.add_parser("data", parents=[common],
                       help="check: read, validate and summarize a study file's dataset; prepare: also cache it")
    s.add_argument("action", choices=["check", "prepare"])
    s.add_argument("file")
    s.set_defaults(func=_cmd_data)

    s = sub.add_parser("run", parents=[common, store],
                       help="run a study file's stages (data, embeddings, SIDs, train, evaluate)")
    s.add_argument("file")
    s.add_argument("--stages", nargs="*", default=None, help="run only these stages (default: the config's)")
    s.add_argument("--methods", nargs="+", default=None,
                   help="run only these methods (overrides methods.run and sets methods.contexts aside: a context "
                        "variant by its name, e.g. none-k5; e.g. one method per session; training.workers trains "
                        "several models at a time in one run)")
    s.add_argument("--seeds", nargs="+", type=int, default=None,
                   help="run only these training seeds (overrides training.seeds; e.g. one seed per session or process)")
    s.set_defaults(func=_cmd_run)

    s = sub.add_parser("serve", parents=[common], help="serve a checkpoint with an in-process engine over HTTP")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("--engine", default="torch", choices=["torch", "hf"])
    s.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    s.add_argument("--port", type=int, default=8100, help="TCP port, 1-65535 (checked before the model loads)")
    s.add_argument("--dtype", default="float32", choices=names.DTYPES,
                   help="auto: bfloat16 on a CUDA device or where the CPU has AMX or AVX512-BF16, else float32")
    s.add_argument("--device", default="cpu",
                   help="cpu, cuda or cuda:N: where the engine runs (checked before the model loads: a CUDA device "
                        "this machine lacks is an error saying what it has)")
    from workbench.engines.torch import options as torch_options

    torch_options.add_flags(s)
    s.set_defaults(func=_cmd_serve)

    s = sub.add_parser("soak", parents=[common],
                       help="a long run of mixed requests against `workbench serve`: failures, answers vs an "
                            "in-process reference, server memory against a derived bound (workbench/load/soak.py)")
    s.add_argument("checkpoint", help="a checkpoint folder, or random:<size> (0.1m, 2.4m, 25m; built with a "
                                      "soft-token projector in a temporary folder)")
    s.add_argument("--url", default=None, help="soak the server already running there instead of starting one")
    s.add_argument("--pid", type=int, default=None, help="with --url: the server's process id (its memory is read "
                                                         "from /proc; without it memory is not checked)")
    s.add_argument("--requests", type=int, default=10_000, help="requests after the warm-up (default 10000)")
    s.add_argument("--concurrency", type=int, default=64, help="requests in flight (default 64)")
    s.add_argument("--seed", type=int, default=0, help="seeds the mix and the prompts (default 0)")
    s.add_argument("--prompt-tokens", type=int, default=24, help="prompt length of every request (default 24)")
    s.add_argument("--beam-width", type=int, default=8, help="beam width of the beam-search kinds (default 8)")
    s.add_argument("--candidates", type=int, default=20, help="catalog items per scoring request (default 20)")
    s.add_argument("--dtype", default="float32", choices=names.DTYPES, help="the server's and the reference's dtype")
    s.add_argument("--threads", type=int, default=1, help="the started server's OMP_NUM_THREADS (default 1)")
    s.add_argument("--request-timeout", type=float, default=120.0, help="seconds before a request is a timeout")
    s.add_argument("--json", default=None, metavar="FILE", help="also write the result (memory samples included)")
    s.set_defaults(func=_cmd_soak)

    s = sub.add_parser("microbench", help="torch engine vs hf baseline, side by side, --floor or --ab (prints "
                                          "ratios; one MLflow run in experiment perf); its flags: microbench -h")
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(func=lambda args: _forwarded("microbench", args.rest)(args))

    s = sub.add_parser("trainbench", help="a study's real training steps timed by phase and op kind, or two training "
                                          "configurations --ab in alternating rounds (one MLflow run in experiment "
                                          "perf); its flags: trainbench -h")
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(func=lambda args: _forwarded("trainbench", args.rest)(args))

    s = sub.add_parser("variant-quality", help="what bfloat16 / int8 cost in Recall@10 and NDCG@10 on a trained "
                                               "study's test users; its flags: variant-quality -h")
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(func=lambda args: _forwarded("variant-quality", args.rest)(args))

    s = sub.add_parser("bench", parents=[common, store],
                       help="run a load-sweep file (latency vs QPS, saturation, cost)")
    s.add_argument("file")
    s.set_defaults(func=_cmd_bench)

    s = sub.add_parser("report", parents=[common, store],
                       help="write a standalone HTML report of MLflow experiment(s)")
    s.add_argument("--experiment", required=True,
                   help="a name, or several comma-separated (a load sweep and the study whose quality it joins)")
    s.add_argument("-o", "--output", required=True)
    s.add_argument("--latest", action="store_true",
                   help="only the most recent load sweep and study run of each experiment, and performance run of "
                        "each command line (a re-run otherwise shows twice)")
    s.add_argument("--png", default=None, metavar="FILE",
                   help="also a PNG picture of the report's top (1200 px wide, at most 2400 px tall; headless "
                        "Chromium)")
    s.set_defaults(func=_cmd_report)

    s = sub.add_parser("engines", parents=[common],
                       help="engine capability matrix, launch or validate an engine server")
    s.add_argument("action", choices=["list", "launch", "validate"])
    s.add_argument("name", nargs="?", default=None)
    s.add_argument("--checkpoint", default=None)
    s.add_argument("--dtype", default="float32", choices=names.DTYPES,
                   help="auto: bfloat16 where the CPU has AMX or AVX512-BF16, else float32")
    s.set_defaults(func=_cmd_engines)
    return p


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the console command (not a call from Python): large tensors on huge pages (malloc.py)
        from workbench.malloc import reexec_with_hugepages

        reexec_with_hugepages()
    argv = sys.argv[1:] if argv is None else list(argv)
    from workbench.progress import quiet_library_bars

    quiet_library_bars()  # off a terminal, the libraries' tqdm frames would fill the log (progress.py)
    head = argv[1:] if argv[:1] == ["--debug"] else argv
    if head[:1] and head[0] in _FORWARDED:  # parses its own flags, handled below like every subcommand
        args = argparse.Namespace(debug=argv[:1] == ["--debug"], func=_forwarded(head[0], head[1:]))
    else:
        args = build_parser().parse_args(argv)
    from workbench import signals

    signals.install()  # SIGTERM/SIGHUP clean up like Ctrl-C (servers stopped, runs KILLED)
    try:
        return args.func(args)
    except KeyboardInterrupt as e:
        print(f"interrupted ({str(e) or 'SIGINT'}): child servers stopped, open runs marked KILLED", file=sys.stderr)
        return signals.exit_status(e)
    except UsageError as e:  # the user's mistake: what is wrong and how to fix it, not a traceback wall
        if args.debug:
            import traceback

            traceback.print_exc()
        else:
            print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
