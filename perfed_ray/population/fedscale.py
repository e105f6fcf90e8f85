"""FedScale's two device traces as perfed-ray's tables (``perfed-ray convert-fedscale``).

FedScale (SymbioticLab/FedScale, benchmark/dataset/data/device_info/README.md) ships
two pickled dictionaries keyed by client id:

- ``client_device_capacity``: ``{'computation': ms, 'communication': kbit/s}``, a
  model's inference time per sample (AI Benchmark) and a bandwidth (MobiPerf). FedScale
  charges a training sample three inference times, forward and backward
  (``ClientMetadata.get_completion_time``'s ``augmentation_factor=3.0``), and one
  bandwidth for both directions; so does this conversion (`train_factor`).
- ``client_behave_trace``: ``{'active': [s], 'inactive': [s], 'finish_time': s, ...}``,
  online intervals [active[i], inactive[i]] repeating every finish_time seconds
  (``ClientMetadata.is_active``).

perfed-ray user u is FedScale's client u + 1 (its clients are numbered from 1), given
the device and the trace FedScale gives that client: the capacity under key
``(u + 1) % len(capacities)`` (``Aggregator.client_register_handler``) and the trace
at position ``(u + 1) % len(traces)`` of the trace dictionary's keys
(``ClientManager.register_client``). Where FedScale falls back to 1 ms and 1 kbit/s for
a missing capacity, the conversion stops and says so.

A table repeats with one period for everyone: the longest finish_time of the chosen
users. A user whose own is shorter has its intervals repeated within that period, so
its availability is FedScale's exactly over the first period and repeats with it
after. FedScale's intervals are closed; here [active, inactive) (an interval of no
length, online at one instant, is dropped), and overlapping ones are joined.

Pickles can run code when read: these are read by a restricted unpickler that builds
only plain containers, numbers and strings (and NumPy scalars), and never by a run.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from perfed_ray.errors import InputError
from perfed_ray.population import availability, devices

TRAIN_FACTOR = 3.0  # FedScale: a training sample takes three inference times
_ALLOWED = {
    ("collections", "OrderedDict"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
}


class _PlainData(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> type:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not plain trace data")
        return super().find_class(module, name)


def read_pickle(path: str | Path, what: str) -> dict:
    """A FedScale trace: a dictionary keyed by client id; InputError if it is not."""
    try:
        data = _PlainData(io.BytesIO(Path(path).read_bytes())).load()
    except OSError as err:
        raise InputError(f"{what} {str(path)!r} cannot be read: {err.strerror}") from None
    except Exception as err:
        raise InputError(f"{what} {str(path)!r} is not a FedScale trace: {err}") from None
    if not isinstance(data, dict) or not data:
        raise InputError(f"{what} {str(path)!r} is not a FedScale trace: not a dictionary")
    return data


@dataclass(frozen=True)
class Converted:
    """What a conversion wrote and what a run needs to read it."""

    devices: Path
    availability: Path
    users: int
    period: float
    shorter: int  # users whose own finish_time is shorter than the period

    def settings(self) -> dict[str, object]:
        """The configuration that runs on the tables."""
        return {
            "n_users": self.users,
            "devices": "table",
            "devices.file": str(self.devices),
            "availability": "table",
            "availability.file": str(self.availability),
            "availability.period": self.period,
        }


def _device_rows(capacities: dict, users: int, train_factor: float) -> pd.DataFrame:
    rows = []
    for u in range(users):
        key = (u + 1) % len(capacities)
        entry = capacities.get(key, capacities.get(str(key)))  # ids as numbers or text
        if entry is None:
            raise InputError(
                f"client_device_capacity has no entry {key} for client {u + 1} (FedScale "
                f"would give it 1 ms and 1 kbit/s): convert fewer users with --users"
            )
        try:
            compute, bandwidth = float(entry["computation"]), float(entry["communication"])
        except (KeyError, TypeError, ValueError):
            raise InputError(
                f"client_device_capacity entry {key} is {entry!r}: FedScale's entries are "
                f"{{'computation': ms, 'communication': kbit/s}}"
            ) from None
        if not (compute > 0 and bandwidth > 0 and np.isfinite(compute * bandwidth)):
            raise InputError(
                f"client_device_capacity entry {key} has computation {compute:g} and "
                f"communication {bandwidth:g}: both must be positive"
            )
        rows.append((u, train_factor * compute, bandwidth, bandwidth))
    return pd.DataFrame(rows, columns=list(devices.COLUMNS))


def _intervals(key: object, trace: dict) -> tuple[list[tuple[float, float]], float]:
    """A client's online intervals within [0, finish_time), sorted and joined."""
    try:
        finish = float(trace["finish_time"])
        pairs = list(zip(trace["active"], trace["inactive"], strict=True))
    except (KeyError, TypeError, ValueError):
        raise InputError(
            f"client_behave_trace entry {key!r} lacks FedScale's 'active', 'inactive' (of "
            f"one length) and 'finish_time'"
        ) from None
    if not finish > 0:
        raise InputError(f"client_behave_trace entry {key!r} has finish_time {finish:g}")
    joined: list[list[float]] = []
    for start, end in sorted((max(0.0, float(a)), min(finish, float(b))) for a, b in pairs):
        if end <= start:
            continue
        if joined and start <= joined[-1][1]:
            joined[-1][1] = max(joined[-1][1], end)
        else:
            joined.append([start, end])
    if not joined:
        raise InputError(
            f"client_behave_trace entry {key!r} is never online (FedScale cannot use it "
            f"either): convert fewer users with --users"
        )
    return [(a, b) for a, b in joined], finish


def _availability_rows(traces: dict, users: int) -> tuple[pd.DataFrame, float, int]:
    keys = list(traces)
    own = [_intervals(k, traces[k]) for k in (keys[(u + 1) % len(keys)] for u in range(users))]
    period = max(finish for _, finish in own)
    rows = []
    for u, (intervals, finish) in enumerate(own):
        for k in range(int(np.ceil(period / finish))):
            offset = k * finish
            rows += [
                (u, offset + a, min(offset + b, period))
                for a, b in intervals
                if offset + a < period
            ]
    frame = pd.DataFrame(rows, columns=list(availability.COLUMNS))
    return frame, period, sum(finish < period for _, finish in own)


def convert(
    device_pickle: str | Path,
    behave_pickle: str | Path,
    out: str | Path,
    users: int | None = None,
    train_factor: float = TRAIN_FACTOR,
) -> Converted:
    """Write ``devices.parquet`` and ``availability.parquet`` under `out` for `users`
    users (default: as many as there are behaviour traces)."""
    capacities = read_pickle(device_pickle, "client_device_capacity")
    traces = read_pickle(behave_pickle, "client_behave_trace")
    users = len(traces) if users is None else users
    if users < 1:
        raise InputError(f"--users {users}: convert at least one user")
    device_rows = _device_rows(capacities, users, train_factor)
    online_rows, period, shorter = _availability_rows(traces, users)
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    written = Converted(
        out / "devices.parquet", out / "availability.parquet", users, period, shorter
    )
    device_rows.to_parquet(written.devices, index=False)
    online_rows.to_parquet(written.availability, index=False)
    return written
