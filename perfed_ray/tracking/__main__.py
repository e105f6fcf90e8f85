"""``python -m perfed_ray.tracking``: the trackers' own process, which a run's
:class:`~perfed_ray.tracking.feed.TrackerFeed` starts (:mod:`.serve` says what it
does). A module of its own, so that the package, which imports :mod:`.serve`, is
loaded before it runs."""

from perfed_ray.tracking.serve import main

main()
