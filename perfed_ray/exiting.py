"""A finished command's exit without the interpreter's teardown.

Tearing down torch's thousands of modules takes one to two seconds after a command has
nothing left to do. ``os._exit`` skips it but also skips the exit hooks that must run
(Ray's shutdown, logging's flush, temporary folders). ``atexit`` runs its hooks last
registered first, so a hook registered before any other runs after all of them: the
package registers :func:`_exit_now` as the first thing it does on import, and the
command arms it with its status. Code that imports the package and never arms it
(``simulate`` from Python, a notebook, the tests) exits as Python always does.
"""

from __future__ import annotations

import atexit
import os
import sys

_status: list[int] = []  # the armed exit status, once the command has one


def arm(status: int) -> None:
    """Exit with `status` once every other exit hook has run."""
    _status[:] = [status]


@atexit.register
def _exit_now() -> None:
    if not _status:
        return
    from perfed_ray import timeline

    sys.stdout.flush()
    sys.stderr.flush()
    timeline.mark("exit")
    os._exit(_status[0])
