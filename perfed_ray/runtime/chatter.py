"""Ray's start-up chatter, kept off a researcher's terminal at the default verbosity.

Two kinds of lines say nothing a user of perfed-ray can act on: the raylet's
"N PYTHON worker processes have been started" (printed by the driver's error
listener when many actors start at once) and the note that a local Ray enabled token
authentication. `perfed-ray run --verbose` (or `simulate(verbose=True)`) shows them;
real errors always pass.
"""

from __future__ import annotations

import logging

HIDDEN = (
    "worker processes have been started on node",
    "Token authentication is enabled for this Ray cluster",
)


class _Hide(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(text in record.getMessage() for text in HIDDEN)


def hide() -> None:
    """Filter those lines out of this driver's output (idempotent)."""
    import ray._private.worker as ray_worker

    printer = ray_worker.print_to_stdstream
    if getattr(printer, "perfed_ray_hides", False):
        return  # filters in place: each simulate() would add another
    logging.getLogger("ray").addFilter(_Hide())
    for handler in logging.getLogger("ray").handlers:
        handler.addFilter(_Hide())

    def print_to_stdstream(data, *args, **kwargs):
        lines = [line for line in data.get("lines", []) if not any(text in line for text in HIDDEN)]
        if lines:
            printer({**data, "lines": lines}, *args, **kwargs)

    print_to_stdstream.perfed_ray_hides = True
    ray_worker.print_to_stdstream = print_to_stdstream
