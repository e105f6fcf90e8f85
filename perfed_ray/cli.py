"""`perfed-ray`: run simulations and sweeps of them, summarise and report results, list
configuration keys.

Exit status: 0 success; 2 bad input (configuration, sweep file, data, output folder,
resume folder), reported in one line before Ray starts; 1 a run that failed or
diverged while running (its rows so far are kept and its runs row says so), or a
sweep with failed trials; 130 interrupted (Ctrl-C or SIGTERM). A run or sweep that
stopped for any reason, SIGKILL included, continues with ``--resume``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import NoReturn

from perfed_ray import __version__, exiting, timeline
from perfed_ray import config as configuration
from perfed_ray.errors import ConfigError, InputError, UnreadableFile
from perfed_ray.results.layout import REPORT, traceback_log


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # a scheduler's SIGTERM ends the run like Ctrl-C: marked, resumable


def _described(cfg: configuration.RunConfig) -> str:
    return (
        f"perfed-ray: {cfg.algorithm} on {cfg.dataset} ({cfg.partition}), "
        f"{cfg.n_users} users, {cfg.users_per_round} per round, {cfg.rounds} rounds"
    )


def cmd_run(args: argparse.Namespace) -> int:
    from perfed_ray.api import check, simulate

    if args.dry_run:
        if args.resume:
            raise ConfigError("--dry-run checks a new run: drop --resume")
        print(_described(check(args.config, args.out, overrides=args.set)))
        print("dry run: the configuration, the data and the results folder check; nothing ran")
        return 0
    shown: dict[str, str] = {}

    def announce(cfg: configuration.RunConfig, result, resumed: bool) -> None:
        again = f"perfed-ray run --resume {result.checkpoint}" + (
            f" --address {args.address}" if args.address else ""
        )
        shown.update(again=again, run_id=result.run_id, out=str(result.out))
        print(_described(cfg), file=sys.stderr)
        print(
            f"run {result.run_id}: results under {result.out}/"
            f"{'' if resumed else '; if it stops: ' + again}",
            file=sys.stderr,
        )
        signal.signal(signal.SIGTERM, _terminate)

    try:
        result = simulate(
            args.config,
            args.out,
            overrides=args.set,
            resume=args.resume,
            address=args.address,
            announce=announce,
            verbose=args.verbose,
            progress=not args.quiet,
        )
    except InputError:
        raise
    except BaseException as err:  # Ctrl-C and SIGTERM too
        if not shown:  # before the run began: nothing was marked
            raise
        return _ended(err, shown)
    _print_table(result.summary(), markdown=False)
    return 0


def _ended(err: BaseException, shown: dict[str, str]) -> int:
    """Say how a run ended and what its runs row says now (read back, so the message
    never claims a status the disk refused); return the exit status."""
    from perfed_ray.lifecycle import expected, recorded, status_of
    from perfed_ray.results.schema import EXIT_CODES
    from perfed_ray.runtime.checkpoint import RunStore

    status, run_id, out = status_of(err), shown["run_id"], shown["out"]
    on_disk, _ = recorded(Path(out), run_id)
    marked = (
        f"it is marked '{status}' in {out}/runs"
        if on_disk == status
        else f"its runs row in {out}/runs could not be written, and "
        + ("there is none" if on_disk is None else f"still says '{on_disk}'")
    )
    started = RunStore(Path(out), run_id).started
    again = (
        f"continue it with\n  {shown['again']}"
        if started
        else "nothing was recorded to continue it from: start it again"
    )
    if status == "interrupted":
        print(f"\ninterrupted: run {run_id}: {marked}; {again}", file=sys.stderr)
    elif status == "diverged":
        print(
            f"\nerror: run {run_id}: {err}\n  {marked}; rows up to round {err.round - 1} are kept",
            file=sys.stderr,
        )
    elif expected(err):
        print(
            f"\nerror: run {run_id} failed: {err}\n  {marked}; {again}",
            file=sys.stderr,
        )
    else:
        log = traceback_log(out, run_id)
        kept = f"traceback in {log}; " if log.exists() else ""
        print(
            f"\nerror: run {run_id} failed: {type(err).__name__}: {err}\n  {marked}; "
            f"{'rows written so far are kept; ' if started else ''}{kept}once fixed, {again}",
            file=sys.stderr,
        )
    return EXIT_CODES[status]


def _bundles(bundles: list[dict[str, float]]) -> str:
    """A trial's placement group in words: its driver's share, then its actors'."""
    driver, *actors = bundles
    each = " + ".join(f"{v:g} {k}" for k, v in actors[0].items()) if actors else "nothing"
    return f"driver {driver.get('CPU', 0):g} CPU, {len(actors)} actors x {each}"


def cmd_sweep(args: argparse.Namespace) -> int:
    from perfed_ray.sweep import spec

    if args.resume:
        if args.sweep or args.set or args.resources or args.out:
            raise ConfigError(
                "--resume continues a sweep as it was given: drop the sweep file, --set, "
                "--resources and --out"
            )
        from perfed_ray.sweep import runner

        folder = runner.locate(args.resume)
        sweep = runner.load(folder)
    else:
        if not args.sweep:
            raise ConfigError("give a sweep file (SWEEP.yaml), or --resume DIR")
        sweep = spec.load(args.sweep, args.set, args.resources)
        if args.dry_run:
            for i, trial in enumerate(sweep.trials):
                print(f"{sweep.describe(i)}  [{_bundles(sweep.resources.bundles(trial))}]")
            print(f"{len(sweep.trials)} trials, varying {', '.join(sweep.varied) or 'nothing'}")
            return 0
        from perfed_ray.sweep import runner

        folder, sweep = runner.check(sweep, Path(args.out or "results"))
    out = folder.parent.parent
    again = f"perfed-ray sweep --resume {folder}" + (
        f" --address {args.address}" if args.address else ""
    )
    print(
        f"sweep {sweep.name}: {len(sweep.trials)} trials, varying "
        f"{', '.join(sweep.varied) or 'nothing'}; results under {out}/; if it stops: {again}",
        file=sys.stderr,
    )
    try:
        outcome = runner.run(
            folder, args.address, args.verbose, " ".join(sys.argv), None if args.resume else sweep
        )
    except KeyboardInterrupt:
        print(f"\ninterrupted: continue the sweep with\n  {again}", file=sys.stderr)
        return 130
    from perfed_ray.analysis import summary

    table = summary(out)
    if not table.empty:
        _print_table(table[table["run_id"].isin(outcome.statuses)], markdown=False)
    if sweep.search:
        picks = runner.best(out, sweep)
        print(f"\nbest by validation accuracy, per {', '.join(sweep.search)}:")
        print(picks.to_string(index=False))
        print(f"(also in {runner.write_best(folder, picks)})")
    note = sweep.privacy_note()
    if note:
        print(f"\n{note}")
    if outcome.errors:
        for run_id, error in outcome.errors.items():
            print(f"error: trial {run_id} failed: {error}", file=sys.stderr)
        print(f"  once fixed, continue the sweep with\n  {again}", file=sys.stderr)
        return 1
    if outcome.unfinished:
        print(
            f"\ninterrupted: {len(outcome.unfinished)} of {len(sweep.trials)} trials did not "
            f"end; continue the sweep with\n  {again}",
            file=sys.stderr,
        )
        return 130
    return 0


def _print_table(table, markdown: bool) -> None:
    from perfed_ray.display import format_summary

    print(format_summary(table, markdown=markdown))


def cmd_summary(args: argparse.Namespace) -> int:
    from perfed_ray.analysis import summary

    if not Path(args.dir).is_dir():
        raise ConfigError(f"results folder {args.dir!r} does not exist")
    table = summary(args.dir)
    if table.empty:
        raise ConfigError(f"no runs under {args.dir!r}: expected {args.dir}/runs/run_id=*/")
    _print_table(table, markdown=args.markdown)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from perfed_ray.report import write_report

    written = write_report(args.dir, args.out or Path(args.dir) / REPORT)
    print(f"wrote {len(written)} files under {written[0].parent}:")
    for path in written:
        print(f"  {path}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from perfed_ray.report.comparison import write_comparison

    print(f"wrote {write_comparison(args.dir, args.out or Path(args.dir) / REPORT)}")
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    print(configuration.reference_text(markdown=args.markdown))
    return 0


def cmd_convert_fedscale(args: argparse.Namespace) -> int:
    import yaml

    from perfed_ray.population.fedscale import convert

    factor = {} if args.train_factor is None else {"train_factor": args.train_factor}
    done = convert(args.devices, args.behaviour, args.out, args.users, **factor)
    print(f"wrote {done.devices} and {done.availability} for {done.users} users")
    if done.shorter:
        print(
            f"{done.shorter} users' traces repeat sooner than the period of "
            f"{done.period:g} s: theirs are repeated within it"
        )
    print("run them with:")
    print(yaml.safe_dump(done.settings(), sort_keys=False).rstrip())
    return 0


def _pairs(command: argparse.ArgumentParser, flag: str, help: str) -> None:
    """A repeatable KEY=VALUE option."""
    command.add_argument(flag, action="append", default=[], metavar="KEY=VALUE", help=help)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(  # the whole docstring: its exit statuses too
        prog="perfed-ray", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    top.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = top.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run one simulation from a configuration file",
        epilog="exit status: 0 finished, or --dry-run found nothing wrong; 1 failed or "
        "diverged (its rows so far are kept); "
        "2 bad input, in one line before Ray starts; 130 interrupted (Ctrl-C or SIGTERM)",
    )
    run.add_argument("config", nargs="?", help="flat YAML configuration (default: all defaults)")
    _pairs(run, "--set", "override one configuration value (repeatable)")
    run.add_argument("--out", help="results folder (default: results/)")
    run.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a stopped run from its last checkpoint: "
        "RESULTS/checkpoints/run_id=ID (printed when it started)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress display")
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="check the configuration, the data and the results folder, and stop "
        "(nothing is written, Ray is not started)",
    )
    run.add_argument(
        "--verbose",
        action="store_true",
        help="show Ray's start-up messages (worker processes, token authentication)",
    )
    run.add_argument(
        "--address",
        help="join the Ray cluster at auto, HOST:PORT or "
        "ray://HOST:PORT (default: $RAY_ADDRESS, else start a local Ray)",
    )
    run.set_defaults(func=cmd_run)
    sweep = sub.add_parser(
        "sweep",
        help="run many simulations as the trials of a Ray Tune sweep (a grid, samples, seeds)",
        epilog="exit status: 0 every trial ended (finished, stopped early or diverged), or "
        "--dry-run listed them; 1 a trial failed; 2 bad input, in one line before Ray starts; "
        "130 interrupted, or trials left unfinished",
    )
    sweep.add_argument("sweep", nargs="?", help="sweep file (see docs/guide/sweeps.md)")
    _pairs(sweep, "--set", "override one configuration value of every trial (repeatable)")
    _pairs(
        sweep,
        "--resources",
        "override what each trial reserves: driver_cpus, cpus or gpus (repeatable)",
    )
    sweep.add_argument("--out", help="results folder (default: results/)")
    sweep.add_argument(
        "--resume",
        metavar="DIR",
        help="continue a stopped sweep: its results folder, or RESULTS/sweeps/NAME",
    )
    sweep.add_argument("--dry-run", action="store_true", help="list the trials and stop")
    sweep.add_argument(
        "--verbose",
        action="store_true",
        help="show Tune's progress tables and Ray's start-up messages",
    )
    sweep.add_argument(
        "--address",
        help="join the Ray cluster at auto or HOST:PORT, from one of its nodes "
        "(default: $RAY_ADDRESS, else start a local Ray)",
    )
    sweep.set_defaults(func=cmd_sweep)
    no_runs = "exit status: 0 done; 2 DIR does not exist or holds no runs"
    summ = sub.add_parser(
        "summary", help="final personalised accuracy of every run in DIR", epilog=no_runs
    )
    summ.add_argument("dir", help="results folder")
    summ.add_argument("--markdown", action="store_true", help="print a Markdown table")
    summ.set_defaults(func=cmd_summary)
    report = sub.add_parser(
        "report",
        help="extended Table 1, learning curves and per-group accuracies of the runs in DIR",
        epilog=no_runs,
    )
    report.add_argument("dir", help="results folder")
    report.add_argument("--out", help=f"report folder (default: DIR/{REPORT})")
    report.set_defaults(func=cmd_report)
    compare = sub.add_parser(
        "compare",
        help="personalised methods side by side in DIR: seen and unseen users, "
        "0, 1 and 5 personalisation steps, 95%% intervals over seeds",
        epilog="exit status: 0 done; 2 DIR holds no runs or no evaluations",
    )
    compare.add_argument("dir", help="results folder")
    compare.add_argument("--out", help=f"report folder (default: DIR/{REPORT})")
    compare.set_defaults(func=cmd_compare)
    keys = sub.add_parser("keys", help="list every configuration key", epilog="exit status: 0")
    keys.add_argument(
        "--markdown", action="store_true", help="as the Markdown table of the docs' reference"
    )
    keys.set_defaults(func=cmd_keys)
    fedscale = sub.add_parser(
        "convert-fedscale",
        help="FedScale's pickled device traces as devices and availability tables "
        "(docs/guide/simulated-time.md)",
        epilog="exit status: 0 the tables written; 2 a file missing, not in FedScale's "
        "format, or holding more than plain data",
    )
    fedscale.add_argument("devices", help="FedScale's client_device_capacity pickle")
    fedscale.add_argument("behaviour", help="FedScale's client_behave_trace pickle")
    fedscale.add_argument("--out", required=True, help="folder for the two Parquet tables")
    fedscale.add_argument(
        "--users", type=int, help="users 0..N-1, FedScale's clients 1..N (default: one a trace)"
    )
    fedscale.add_argument(
        "--train-factor",
        type=float,
        help="a training sample's time in inference times (default: FedScale's 3, forward "
        "and backward)",
    )
    fedscale.set_defaults(func=cmd_convert_fedscale)
    return top


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A skipped results file as one line; other warnings as Python shows them."""
    if issubclass(category, UnreadableFile):
        print(f"warning: {message}", file=sys.stderr)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


def main(argv: list[str] | None = None) -> int:
    timeline.mark("cli")
    args = parser().parse_args(argv)
    warnings.showwarning = _show_warning
    start = time.perf_counter()
    try:
        status = args.func(args)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if args.command in ("run", "sweep") and status == 0 and not getattr(args, "dry_run", False):
        from perfed_ray.display import duration  # pandas: not for a command refused at once

        print(f"done in {duration(time.perf_counter() - start)}", file=sys.stderr)
    return status


def entry() -> NoReturn:
    """The `perfed-ray` command: :func:`main`, then an exit that runs every exit hook
    (Ray stopped, temporary folders removed, output flushed) but skips the interpreter's
    teardown (:mod:`perfed_ray.exiting`)."""
    status = main()
    exiting.arm(status)
    sys.exit(status)


if __name__ == "__main__":
    entry()
