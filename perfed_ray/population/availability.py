"""When users are online on the simulated clock (`availability`: always, diurnal, table;
the settings in the `availability` section).

Every answer is a pure function of (user, time) and the run's configuration: no state is
kept between questions, so the order in which the clock asks (or which process asks)
cannot change an answer. FedScale's ``ClientMetadata.is_active`` keeps an index that
each question moves on (fedscale/cloud/internal/client_metadata.py), so its answers
depend on the questions asked before. Intervals are half-open, [start, end): a user is
online at its start and offline at its end. Times are simulated seconds from the run's
start; each pattern repeats every `availability.period` seconds (a day by default).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from perfed_ray.config.owners import HParams
from perfed_ray.config.schema import RunConfig
from perfed_ray.config.settings import Setting
from perfed_ray.errors import ConfigError
from perfed_ray.population import keyed, tables
from perfed_ray.seeding import Stream

COLUMNS = ("user", "start", "end")
DAY = 86400.0

SETTINGS: dict[str, Setting] = {
    "online": Setting(
        0.25,
        "diurnal: the fraction of each period a user is online, in one window (6 hours "
        "of a day: an assumption, phones idle and charging overnight)",
        low=0,
        high=1,
        low_open=True,
    ),
    "period": Setting(
        DAY,
        "seconds after which availability repeats: diurnal's day, the table's cycle",
        low=0,
        low_open=True,
    ),
    "file": Setting(
        "",
        "table: a Parquet or CSV file with columns user, start, end: online intervals "
        "[start, end) in seconds within [0, period], at least one for each user 0 to "
        "n_users - 1, none overlapping (read on the driver, relative to where the run "
        "starts)",
    ),
}


@dataclass(frozen=True, kw_only=True)
class AvailabilityHParams(HParams):
    """What an availability model reads of a run: the `availability` section, the seed
    its draws are keyed by and the users it answers for."""

    key: ClassVar[str] = "availability"
    seed: int
    n_users: int


def _arrays(users: np.ndarray, t: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    users = np.asarray(users, dtype=np.int64)
    return users, np.broadcast_to(np.asarray(t, dtype=np.float64), users.shape)


class Availability:
    """Who is online when. The array forms answer for many users at once (`t` one time
    for all, or one per user); the scalar forms answer for one user with the same
    numbers. The base of every availability model: a model of one's own subclasses it,
    implements the three array forms and is named by dotted path.

    `always` is this base: everyone online at every time."""

    settings: ClassVar[dict[str, Setting]] = SETTINGS
    HParams: ClassVar[type[AvailabilityHParams]] = AvailabilityHParams

    def __init__(self, hparams: AvailabilityHParams | RunConfig) -> None:
        self.hparams = self.HParams.given(hparams)
        self.section = self.hparams.section

    @classmethod
    def validate(cls, hparams: AvailabilityHParams) -> None:
        """Raise ConfigError for settings (or a table) the model cannot use, when the
        configuration is read: before Ray starts."""

    def online_array(self, users: np.ndarray, t: float | np.ndarray) -> np.ndarray:
        """Whether each user is online at time `t`."""
        users, t = _arrays(users, t)
        return np.ones(users.shape, dtype=bool)

    def online_until_array(self, users: np.ndarray, t: float | np.ndarray) -> np.ndarray:
        """When each user online at `t` goes offline (the end of its interval holding
        `t`; inf for one never going offline); `t` itself for a user offline at `t`."""
        users, t = _arrays(users, t)
        return np.full(users.shape, math.inf)

    def next_online_array(self, users: np.ndarray, t: float | np.ndarray) -> np.ndarray:
        """When each user is next online at or after `t` (`t` itself if online)."""
        users, t = _arrays(users, t)
        return t.copy()

    def online(self, user: int, t: float) -> bool:
        return bool(self.online_array(np.array([user]), t)[0])

    def online_until(self, user: int, t: float) -> float:
        return float(self.online_until_array(np.array([user]), t)[0])

    def next_online(self, user: int, t: float) -> float:
        return float(self.next_online_array(np.array([user]), t)[0])


class Diurnal(Availability):
    """`availability: diurnal`: each user is online for `online` of every period (a
    day), in one window that starts at the same time each period, a time drawn once per
    user, uniformly over the period, from a stream keyed by (seed, availability, user):
    users' days are spread over the clock as time zones and habits spread them. Every
    user's start is drawn on first use (8 bytes a user) and then looked up."""

    def __init__(self, hparams: AvailabilityHParams | RunConfig) -> None:
        super().__init__(hparams)
        self.period = self.section["period"]
        self.length = self.section["online"] * self.period
        self._starts: np.ndarray | None = None

    def _phase(self, users: np.ndarray, t: np.ndarray) -> np.ndarray:
        """How long after its window opened, within the period, each user is at `t`."""
        if self._starts is None:
            everyone = np.arange(self.hparams.n_users, dtype=np.int64)
            self._starts = self.period * keyed.uniforms(
                self.hparams.seed, Stream.AVAILABILITY, everyone, 0
            )
        return np.mod(t - self._starts[users], self.period)

    def online_array(self, users: np.ndarray, t: float | np.ndarray) -> np.ndarray:
        users, t = _arrays(users, t)
        return self._phase(users, t) < self.length

    def online_until_array(self, users: np.ndarray, t: float | np.ndarray) -> np.ndarray:
        users, t = _arrays(users, t)
        if self.length >= self.period:
            return np.full(users.shape, math.inf)
        phase = self._phase(users, t)
        return np.where(phase < self.length, t + (self.length - phase), t)

    def next_online_array(self, users: np.ndarray, t: float | np.ndarray) -> np.ndarray:
        users, t = _arrays(users, t)
        phase = self._phase(users, t)
        return np.where(phase < self.length, t, t + (self.period - phase))


class TableAvailability(Availability):
    """`availability: table`: each user online in its intervals of `availability.file`
    (columns user, start, end), repeated every `availability.period` seconds. Intervals
    that touch are one; a user online at the period's end and at its start stays online
    across the turn. The intervals are kept sorted, user after user (24 bytes an
    interval), and searched for all the users asked about at once."""

    @classmethod
    def validate(cls, hparams: AvailabilityHParams) -> None:
        cls._intervals(hparams)

    @staticmethod
    def _intervals(hparams: AvailabilityHParams) -> Intervals:
        mine = hparams.section
        return _intervals(tables.stamp(KEY, mine["file"]), hparams.n_users, mine["period"])

    def __init__(self, hparams: AvailabilityHParams | RunConfig) -> None:
        super().__init__(hparams)
        self.period = self.section["period"]
        self.offsets, self.starts, self.ends, self.until = self._intervals(self.hparams)

    def _where(self, users: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, ...]:
        """For each user: the start of the period holding `t`, the index of the user's
        first interval starting after `t`'s phase in that period (the end of its run of
        intervals if none does), and whether the interval before that one holds `t`.
        A binary search within each user's run of intervals, all the users' at once."""
        phase = np.mod(t, self.period)
        low, high = self.offsets[users].copy(), self.offsets[users + 1].copy()
        while (open_ := low < high).any():
            middle = (low + high) // 2
            after = self.starts[np.minimum(middle, len(self.starts) - 1)] <= phase
            low = np.where(open_ & after, middle + 1, low)
            high = np.where(open_ & ~after, middle, high)
        on = (low > self.offsets[users]) & (phase < self.ends[np.maximum(low - 1, 0)])
        return t - phase, low, on

    def online_array(self, users: np.ndarray, t: float | np.ndarray) -> np.ndarray:
        users, t = _arrays(users, t)
        return self._where(users, t)[2]

    def online_until_array(self, users: np.ndarray, t: float | np.ndarray) -> np.ndarray:
        users, t = _arrays(users, t)
        base, following, on = self._where(users, t)
        return np.where(on, base + self.until[np.maximum(following - 1, 0)], t)

    def next_online_array(self, users: np.ndarray, t: float | np.ndarray) -> np.ndarray:
        users, t = _arrays(users, t)
        base, following, on = self._where(users, t)
        later = following < self.offsets[users + 1]
        start = np.where(
            later,
            base + self.starts[np.minimum(following, len(self.starts) - 1)],
            base + self.period + self.starts[self.offsets[users]],
        )
        return np.where(on, t, start)


KEY = "availability.file"
Intervals = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@functools.lru_cache(maxsize=2)
def _intervals(stamp: tables.Stamp, n_users: int, period: float) -> Intervals:
    """An availability table's intervals, checked, touching ones joined, user after
    user in order of start: (offsets [n_users + 1] of each user's run of them, their
    starts, their ends, and where each really ends: a user's last interval reaching
    the period's end goes on into its first, for good if that is the whole period)."""
    path = stamp[0]
    columns = tables.read(KEY, path, COLUMNS)
    users, starts, ends = (columns[c] for c in COLUMNS)
    if not (
        (np.diff(users) >= 0).all() and (np.diff(starts)[users[1:] == users[:-1]] >= 0).all()
    ):  # a converted table comes sorted: sorting 10^6 users' rows takes seconds
        order = np.lexsort((starts, users))
        users, starts, ends = users[order], starts[order], ends[order]
    tables.check_users(KEY, path, users, n_users, once=False)
    bad = (starts < 0) | (ends <= starts) | (ends > period)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ConfigError(
            f"{KEY} = {path!r}: user {users[i]} has the interval [{starts[i]:g}, "
            f"{ends[i]:g}); an interval needs 0 <= start < end <= availability.period "
            f"= {period:g}"
        )
    same = users[1:] == users[:-1]
    overlap = same & (starts[1:] < ends[:-1])
    if overlap.any():
        i = int(np.flatnonzero(overlap)[0])
        raise ConfigError(
            f"{KEY} = {path!r}: user {users[i]}'s intervals [{starts[i]:g}, {ends[i]:g}) "
            f"and [{starts[i + 1]:g}, {ends[i + 1]:g}) overlap"
        )
    first = np.concatenate([[True], ~(same & (starts[1:] == ends[:-1]))])
    last = np.concatenate([first[1:], [True]])
    users, starts, ends = users[first], starts[first], ends[last]
    offsets = np.searchsorted(users, np.arange(n_users + 1))
    until = ends.copy()
    head, tail = offsets[:-1], offsets[1:] - 1
    wraps = (starts[head] == 0) & (ends[tail] == period)
    until[tail[wraps]] = period + ends[head[wraps]]
    until[tail[wraps & (head == tail)]] = math.inf
    return offsets, starts, ends, until
