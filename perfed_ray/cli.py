"""`perfed-ray`: run simulations, summarise and report results, list configuration keys.

Exit status: 0 success; 2 bad input (configuration, data, output folder, resume
folder), reported in one line before Ray starts; 1 a run that failed or diverged
while running (its rows so far are kept and its runs row says so); 130
interrupted (Ctrl-C or SIGTERM). A run that stopped for any reason, SIGKILL
included, continues from its last checkpoint with ``--resume``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from perfed_ray import config as configuration
from perfed_ray.errors import ConfigError, InputError

LOGS = "logs"  # tracebacks of failed runs, under the results folder
REPORT = "report"  # `perfed-ray report`'s default folder, under the results folder


class ProgressDisplay:
    """One status line, redrawn in place on a terminal, printed at evaluations otherwise."""

    def __init__(self, run_id: str, stream=sys.stderr) -> None:
        self.run_id = run_id
        self.stream = stream
        self.tty = stream.isatty()
        self.last_printed: int | None = None

    def __call__(self, p) -> None:  # p: runtime.coordinator.Progress
        eta = (p.rounds - p.round) / max(p.rounds_per_second, 1e-9)
        acc = "-" if p.accuracy is None else f"{100 * p.accuracy:.2f}% (round {p.accuracy_round})"
        width = 20
        bar = "#" * int(width * p.round / p.rounds)
        line = (f"round {p.round}/{p.rounds} [{bar:<{width}}] "
                f"{p.rounds_per_second:.2f} rounds/s, eta {_duration(eta)} | "
                f"personalised acc {acc}")
        if self.tty:
            self.stream.write("\r\033[K" + line + ("\n" if p.round == p.rounds else ""))
            self.stream.flush()
        elif p.accuracy_round != self.last_printed or p.round == p.rounds:
            self.last_printed = p.accuracy_round
            print(line, file=self.stream, flush=True)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else (
        f"{seconds // 60}m{seconds % 60:02d}s")


def _check_out(out: Path) -> None:
    """A results folder must be creatable, writable, and empty or perfed-ray's own:
    runs are added to it side by side, but never mixed into someone else's files."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--out {str(out)!r} cannot be created ({err.strerror}): choose a "
                          f"writable folder") from None
    if not os.access(out, os.W_OK):
        raise ConfigError(f"--out {str(out)!r} is not writable: choose a writable folder")
    from perfed_ray.results.writer import TABLES
    from perfed_ray.runtime.checkpoint import FOLDER

    ours = {*TABLES, FOLDER, LOGS, REPORT}
    foreign = sorted(p.name for p in out.iterdir()
                     if p.name not in ours and not p.name.startswith("."))
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise ConfigError(f"--out {str(out)!r} is not empty and not a perfed-ray results "
                          f"folder (it holds {shown}): choose an empty or new folder, or an "
                          f"existing results folder")


def _resumable(args: argparse.Namespace) -> tuple[configuration.RunConfig, Path, str]:
    """The configuration, results folder and id of the run `--resume` names, after
    checking that it can and should be continued."""
    from perfed_ray.runtime.checkpoint import RunStore, locate

    out, run_id = locate(args.resume)
    if args.out is not None and Path(args.out).resolve() != out.resolve():
        raise ConfigError(f"--out {args.out!r} differs from the folder of the run being "
                          f"resumed ({out}): drop --out")
    record = RunStore(out, run_id).load_record()
    if (pid := record.live_driver()) is not None:
        raise ConfigError(f"run {run_id} is still running (driver pid {pid} on this machine): "
                          f"stop it first, or wait for it")
    stored = configuration.from_mapping(record.config)
    if args.config is not None or args.set:  # a file is compared whole, --set on its own
        given = (configuration.load(args.config, args.set) if args.config is not None else
                 configuration.from_mapping({**stored.to_dict(),
                                             **configuration.parse_overrides(args.set)}))
        changed = [(k, v, getattr(given, k)) for k, v in stored.to_dict().items()
                   if getattr(given, k) != v
                   and not (configuration.FIELDS[k].metadata["auto"] and getattr(given, k) is None)]
        if changed:
            k, old, new = changed[0]
            more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
            raise ConfigError(f"--resume: run {run_id} was started with a different "
                              f"configuration: {k} = {old!r} there, {new!r} here{more}; give "
                              f"--resume alone to continue it as it was, or start a new run")
    status, error = _status(out, run_id)
    if status == "finished":
        raise ConfigError(f"run {run_id} already finished all {stored.rounds} rounds: "
                          f"nothing to resume")
    if status == "diverged":
        raise ConfigError(f"run {run_id} diverged ({error}); resuming would diverge again: "
                          f"start a new run with a smaller beta or alpha")
    return stored, out, run_id


def _status(out: Path, run_id: str) -> tuple[str | None, str | None]:
    """A run's status and error from its runs row, (None, None) if it has none."""
    from perfed_ray.analysis import read_table

    runs = read_table(out, "runs", run_id)
    if runs.empty:
        return None, None
    return runs["status"].iloc[0], runs["error"].iloc[0]


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # a scheduler's SIGTERM ends the run like Ctrl-C: marked, resumable


def cmd_run(args: argparse.Namespace) -> int:
    if args.resume:
        cfg, out, run_id = _resumable(args)
    else:
        cfg, run_id = configuration.load(args.config, args.set), None
        out = Path(args.out or "results")
        _check_out(out)
    print(f"perfed-ray: {cfg.algorithm} on {cfg.dataset} ({cfg.partition}), {cfg.n_users} "
          f"users, {cfg.users_per_round} per round, {cfg.rounds} rounds", file=sys.stderr)
    from perfed_ray.runtime import connect, simulation  # Ray and torch: after validation
    from perfed_ray.runtime.checkpoint import RunStore
    from perfed_ray.runtime.coordinator import Diverged
    from perfed_ray.runtime.pool import WorkFailed

    prepared = simulation.prepare(cfg)
    address = connect.cluster_address(args.address)
    if address:
        connect.connect(address)
    resume = run_id is not None
    run_id = run_id or simulation.new_run_id(cfg)
    again = (f"perfed-ray run --resume {RunStore(out, run_id).folder}"
             + (f" --address {args.address}" if args.address else ""))
    print(f"run {run_id}: results under {out}/{'' if resume else '; if it stops: ' + again}",
          file=sys.stderr)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        simulation.run(prepared, out, None if args.quiet else ProgressDisplay(run_id), run_id,
                       resume=resume)
    except Diverged as err:
        print(f"\nerror: run {run_id}: {err}\n  it is marked 'diverged' in {out}/runs; rows up "
              f"to round {err.round - 1} are kept", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\ninterrupted: run {run_id} is marked 'interrupted'; continue it with\n  "
              f"{again}", file=sys.stderr)
        return 130
    except WorkFailed as err:
        print(f"\nerror: run {run_id} failed: {err}\n  it is marked 'failed' in {out}/runs; "
              f"continue it with\n  {again}", file=sys.stderr)
        return 1
    except Exception as err:
        log = out / LOGS / f"{run_id}.txt"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(traceback.format_exc())
        print(f"\nerror: run {run_id} failed: {type(err).__name__}: {err}\n"
              f"  it is marked 'failed' in {out}/runs; rows written so far are kept; "
              f"traceback in {log}; once fixed, continue it with\n  {again}", file=sys.stderr)
        return 1
    from perfed_ray.analysis import summary

    _print_table(summary(out, run_id), markdown=False)
    return 0


def _print_table(table, markdown: bool) -> None:
    from perfed_ray.analysis import format_summary

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


def cmd_keys(args: argparse.Namespace) -> int:
    print(configuration.reference_text(markdown=args.markdown))
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="perfed-ray", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one simulation from a configuration file")
    run.add_argument("config", nargs="?", help="flat YAML configuration (default: all defaults)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override one configuration value (repeatable)")
    run.add_argument("--out", help="results folder (default: results/)")
    run.add_argument("--resume", metavar="RUN_DIR",
                     help="continue a stopped run from its last checkpoint: "
                          "RESULTS/checkpoints/run_id=ID (printed when it started)")
    run.add_argument("--quiet", action="store_true", help="no progress display")
    run.add_argument("--address", help="join the Ray cluster at auto, HOST:PORT or "
                     "ray://HOST:PORT (default: $RAY_ADDRESS, else start a local Ray)")
    run.set_defaults(func=cmd_run)
    summ = sub.add_parser("summary", help="final personalised accuracy of every run in DIR")
    summ.add_argument("dir", help="results folder")
    summ.add_argument("--markdown", action="store_true", help="print a Markdown table")
    summ.set_defaults(func=cmd_summary)
    report = sub.add_parser("report", help="extended Table 1, learning curves and per-group "
                            "accuracies of the runs in DIR")
    report.add_argument("dir", help="results folder")
    report.add_argument("--out", help=f"report folder (default: DIR/{REPORT})")
    report.set_defaults(func=cmd_report)
    keys = sub.add_parser("keys", help="list every configuration key")
    keys.add_argument("--markdown", action="store_true", help="print the README's table")
    keys.set_defaults(func=cmd_keys)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    start = time.perf_counter()
    try:
        status = args.func(args)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if args.command == "run" and status == 0:
        print(f"done in {_duration(time.perf_counter() - start)}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
