"""`perfed-ray`: run simulations, summarise results, list configuration keys.

Exit status: 0 success; 2 bad input (configuration, data, output folder),
reported in one line before Ray starts; 1 a run that failed while running
(its rows so far are kept and its runs row says `failed`); 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

from perfed_ray import config as configuration
from perfed_ray.errors import ConfigError, InputError


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
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--out {str(out)!r} cannot be created ({err.strerror}): choose a "
                          f"writable folder") from None
    if not os.access(out, os.W_OK):
        raise ConfigError(f"--out {str(out)!r} is not writable: choose a writable folder")


def cmd_run(args: argparse.Namespace) -> int:
    cfg = configuration.load(args.config, args.set)
    out = Path(args.out)
    _check_out(out)
    print(f"perfed-ray: {cfg.algorithm} on {cfg.dataset} ({cfg.partition}), {cfg.n_users} "
          f"users, {cfg.users_per_round} per round, {cfg.rounds} rounds", file=sys.stderr)
    from perfed_ray.runtime import connect, simulation  # Ray and torch: after validation
    from perfed_ray.runtime.coordinator import Diverged

    prepared = simulation.prepare(cfg)
    address = connect.cluster_address(args.address)
    if address:
        connect.connect(address)
    run_id = simulation.new_run_id(cfg)
    print(f"run {run_id}: results under {out}/", file=sys.stderr)
    try:
        simulation.run(prepared, out, None if args.quiet else ProgressDisplay(run_id), run_id)
    except Diverged as err:
        print(f"\nerror: run {run_id}: {err}\n  it is marked 'diverged' in {out}/runs; rows up "
              f"to round {err.round - 1} are kept", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\ninterrupted: run {run_id} is marked 'interrupted'; rows written so far are "
              f"under {out}/", file=sys.stderr)
        return 130
    except Exception as err:
        log = out / "logs" / f"{run_id}.txt"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(traceback.format_exc())
        print(f"error: run {run_id} failed: {type(err).__name__}: {err}\n"
              f"  it is marked 'failed' in {out}/runs; rows written so far are kept; "
              f"traceback in {log}", file=sys.stderr)
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
    run.add_argument("--out", default="results", help="results folder (default: results/)")
    run.add_argument("--quiet", action="store_true", help="no progress display")
    run.add_argument("--address", help="join the Ray cluster at auto, HOST:PORT or "
                     "ray://HOST:PORT (default: $RAY_ADDRESS, else start a local Ray)")
    run.set_defaults(func=cmd_run)
    summ = sub.add_parser("summary", help="final personalised accuracy of every run in DIR")
    summ.add_argument("dir", help="results folder")
    summ.add_argument("--markdown", action="store_true", help="print a Markdown table")
    summ.set_defaults(func=cmd_summary)
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
