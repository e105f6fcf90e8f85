"""A run's state on disk, so that an interrupted run continues with exactly its numbers.

Under ``<out>/checkpoints/run_id=<id>/``:

- ``run.json``, written at the start of every sitting: the resolved configuration, the
  users' placement on actors, when the run started and how often it was resumed;
- ``checkpoint.npz``, rewritten every ``checkpoint_every`` rounds and at the end: the
  round k, the server's whole state (:class:`~perfed_ray.strategy.ServerState`: the
  global model w_k, the server optimiser's state such as FedAdam's moments, and a
  strategy's own arrays), every user's per-user state (for methods that keep one),
  how many rows of each table belong to rounds up to k, the wall time spent so far
  and the last evaluated accuracy; the simulated clock and its queue (the tasks in
  flight and in the server's buffer: :class:`~perfed_ray.clock.Schedule`), and the
  updates the actors hold for an asynchronous server, with the models they started
  from.

No random generator state is saved because the run has none that evolves: every
draw is keyed by (seed, purpose, user, round, draw) (:mod:`perfed_ray.seeding`), so
the rounds after k draw the same numbers whenever and wherever they run. The
placement is saved because batched training sums users in a fixed grouping.
Both files are replaced atomically; a crash leaves the previous version whole.
"""

from __future__ import annotations

import json
import re
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from perfed_ray import faults
from perfed_ray.errors import ConfigError, first_line
from perfed_ray.results.layout import CHECKPOINTS
from perfed_ray.results.writer import write_atomically
from perfed_ray.strategy import ServerState

_RUN_ID = re.compile(r"run_id=(.+)")
# Prefixes of the server state's named arrays in checkpoint.npz: the optimiser's (absent
# in checkpoints of runs before server optimisers kept state), a strategy's own and the
# privacy mechanism's.
SERVER, EXTRA, PRIVACY = "server.", "strategy.", "privacy."


@dataclass(frozen=True)
class RunRecord:
    """What a run was started with; read back by ``--resume``."""

    run_id: str
    config: dict[str, Any]
    blocks: list[range]
    started_at: str  # ISO 8601, UTC
    command: str
    resumes: int = 0
    driver: str = ""  # "host:pid" of the latest sitting's driver


@dataclass(frozen=True)
class Checkpoint:
    """The state after round `round`: everything the remaining rounds depend on."""

    round: int
    server: ServerState
    rows: dict[str, int]  # rows written per result table
    wall_seconds: float
    accuracy: tuple[int, float] | None
    states: dict[int, np.ndarray] = field(default_factory=dict)  # user -> flat state
    schedule: dict[str, Any] | None = None  # the clock and its queue, as JSON values
    # task -> (user, version, model, loss, the actor holding it)
    held: dict[int, tuple] = field(default_factory=dict)
    bases: dict[int, np.ndarray] = field(default_factory=dict)  # version -> its model

    def states_of(self, users: list[int]) -> dict[int, np.ndarray]:
        """The per-user states of the given users (those that have one)."""
        return {u: self.states[u] for u in users if u in self.states}


def _arrays(saved: np.lib.npyio.NpzFile, prefix: str) -> dict[str, np.ndarray]:
    return {k.removeprefix(prefix): saved[k] for k in saved.files if k.startswith(prefix)}


def _stacked(vectors: list[np.ndarray]) -> np.ndarray:
    return np.stack(vectors) if vectors else np.zeros((0, 0), np.float32)


def _held(saved: np.lib.npyio.NpzFile) -> tuple[dict[int, tuple], dict[int, np.ndarray]]:
    """The held updates and their models' versions (none in older checkpoints)."""
    if "held_tasks" not in saved.files or not len(saved["held_tasks"]):
        return {}, {}
    names = ("held_tasks", "held_users", "held_versions", "held_losses", "held_actors")
    models = saved["held_models"]
    held = {
        int(t): (int(u), int(v), models[i], float(loss), int(a))
        for i, (t, u, v, loss, a) in enumerate(zip(*(saved[k] for k in names), strict=True))
    }
    bases = saved["bases"]
    return held, {int(v): bases[i] for i, v in enumerate(saved["base_versions"])}


def damaged(path: Path, err: BaseException) -> ConfigError:
    """One line naming a run file that cannot be read and why (a truncated or
    corrupted file, or one without a field it must have)."""
    return ConfigError(
        f"{path} is damaged ({first_line(err)}): this run cannot be resumed; start it again"
    )


def _block(saved: dict[str, int] | list[int]) -> range:
    """A block as run.json keeps it, {start, stop}, or as older versions' run.json
    files keep it, every user listed (their blocks are contiguous too), so that their
    runs can still be resumed."""
    if isinstance(saved, dict):
        return range(saved["start"], saved["stop"])
    if saved != list(range(saved[0], saved[0] + len(saved))):
        raise ValueError("a block of users is not contiguous")
    return range(saved[0], saved[0] + len(saved))


class RunStore:
    """Reads and writes one run's record and checkpoint."""

    RECORD = "run.json"  # a run exists, and can be resumed, once this is written

    def __init__(self, out: Path, run_id: str) -> None:
        self.folder = Path(out) / CHECKPOINTS / f"run_id={run_id}"

    @property
    def started(self) -> bool:
        """Whether the run got as far as its record: something to continue."""
        return (self.folder / self.RECORD).exists()

    def save_record(self, record: RunRecord) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        blocks = [{"start": b.start, "stop": b.stop} for b in record.blocks]
        fields = asdict(record) | {"blocks": blocks}
        text = json.dumps(fields, indent=1)
        write_atomically(self.folder / self.RECORD, lambda tmp: tmp.write_text(text))

    def load_record(self) -> RunRecord:
        path = self.folder / self.RECORD
        try:
            fields = json.loads(path.read_text())
            return RunRecord(**fields | {"blocks": [_block(b) for b in fields["blocks"]]})
        except FileNotFoundError:
            raise ConfigError(
                f"{path} does not exist: {self.folder} is not the folder of "
                f"a run that can be resumed"
            ) from None
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise damaged(path, err) from None

    def save(self, checkpoint: Checkpoint) -> None:
        meta = json.dumps(
            {
                "round": checkpoint.round,
                "rows": checkpoint.rows,
                "wall_seconds": checkpoint.wall_seconds,
                "accuracy": checkpoint.accuracy,
                "schedule": checkpoint.schedule,
            }
        )

        def write(tmp: Path) -> None:
            users = sorted(checkpoint.states)
            states = (
                np.stack([checkpoint.states[u] for u in users])
                if users
                else np.zeros((0, 0), np.float32)
            )
            server = checkpoint.server
            tasks = sorted(checkpoint.held)
            held = [checkpoint.held[t] for t in tasks]
            versions = sorted(checkpoint.bases)
            with open(tmp, "wb") as file:  # a file object: np.savez would add ".npz"
                np.savez(
                    file,
                    weights=server.weights,
                    meta=np.array(meta),
                    state_users=np.array(users, dtype=np.int64),
                    states=states,
                    held_tasks=np.array(tasks, dtype=np.int64),
                    held_users=np.array([h[0] for h in held], dtype=np.int64),
                    held_versions=np.array([h[1] for h in held], dtype=np.int64),
                    held_models=_stacked([h[2] for h in held]),
                    held_losses=np.array([h[3] for h in held], dtype=np.float64),
                    held_actors=np.array([h[4] for h in held], dtype=np.int64),
                    base_versions=np.array(versions, dtype=np.int64),
                    bases=_stacked([checkpoint.bases[v] for v in versions]),
                    **{f"{SERVER}{k}": v for k, v in server.optimizer.items()},
                    **{f"{EXTRA}{k}": v for k, v in server.extra.items()},
                    **{f"{PRIVACY}{k}": v for k, v in server.privacy.items()},
                )

        write_atomically(
            self.folder / "checkpoint.npz",
            write,
            lambda: faults.crash_at("driver-checkpoint", checkpoint.round),
        )

    def load(self) -> Checkpoint | None:
        """The last checkpoint, or None if the run stopped before its first."""
        path = self.folder / "checkpoint.npz"
        if not path.exists():
            return None
        try:
            with np.load(path) as saved:
                meta = json.loads(str(saved["meta"]))
                if "rows" not in meta:  # it counts part files, which this writer replaces
                    raise ConfigError(
                        f"{path} was written by a perfed-ray older than one results file "
                        f"per table and run: resume it with that version, or start "
                        f"it again"
                    )
                users = saved.get("state_users", [])  # none before per-user state
                stacked = saved["states"] if len(users) else None  # read once: it is big
                accuracy = tuple(meta["accuracy"]) if meta["accuracy"] else None
                return Checkpoint(
                    meta["round"],
                    ServerState(
                        saved["weights"],
                        _arrays(saved, SERVER),
                        _arrays(saved, EXTRA),
                        _arrays(saved, PRIVACY),
                    ),
                    meta["rows"],
                    meta["wall_seconds"],
                    accuracy,
                    {int(u): stacked[i] for i, u in enumerate(users)},
                    meta.get("schedule"),  # none before the simulated clock
                    *_held(saved),
                )
        except ConfigError:
            raise
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as err:
            raise damaged(path, err) from None


def locate(run_dir: str | Path) -> tuple[Path, str]:
    """(results folder, run id) of a run folder: ``<out>/<table>/run_id=<id>`` for any
    of the run's tables or its checkpoints."""
    path = Path(run_dir)
    match = _RUN_ID.fullmatch(path.name)
    if not path.is_dir() or not match:
        raise ConfigError(
            f"--resume {str(run_dir)!r} is not a run folder: give "
            f"<results>/checkpoints/run_id=<id> (printed when the run started)"
        )
    return path.parent.parent, match.group(1)
