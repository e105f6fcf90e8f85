"""The local Ray a driver starts for itself, stopped without the grace periods a
long-lived cluster needs.

A short run spends more of its time starting and stopping Ray than training: `ray.init`
takes 2-3 s, mostly waiting for its processes, and Ray's own exit hook sleeps half a
second "for log messages to finish printing", then stops the node's processes one by
one, giving each a second's grace; the autoscaler's monitor, which a local run never
uses, always takes the whole second. So :func:`stop` runs before Ray's hook at
interpreter exit: it stops the monitor at once and then shuts Ray
down as Ray does, without the sleep. A Ray the driver did not start (a cluster it
joined, a session a notebook or a test started) is left as it is.

Ray's `preload_python_modules: [torch]` (the workers Ray starts while `ray.init`
connects import torch before an actor needs it, most of an actor's start) is not set:
its gain is within the spread of a run's fixed cost on a small machine
(experiments/bench/breakdown.py --baseline compares the two), because the early
imports compete with Ray's own start for the same cores, and its idle workers would
hold torch's memory where a run has fewer actors than CPUs.
"""

from __future__ import annotations

import atexit
import logging
import signal
from collections.abc import Iterable

import ray

from perfed_ray import timeline
from perfed_ray.config.schema import RunConfig
from perfed_ray.runtime.environment import plugin_modules

# Ray's name for the autoscaler's monitor among its node's processes.
_MONITOR = "monitor"
_started = False  # this process started the local Ray it is connected to
# Objects up to this size travel inline with a call or its reply instead of through the
# object store (Ray's default: 100 KB): the MLP's weights (272 KB) out and each actor's
# float64 sum (545 KB) back, 1.4 ms sooner a round here (10.0 against 8.6 ms for two
# actors' bare round); larger models' (LeNet's 2.4 MB sums) stay in the store, where
# inline replies were slower still (14-15 against 20-22 ms).
INLINE_BYTES = 2**20
# Ray runs its workers at niceness 15 (`worker_niceness`), so that its own services
# keep a CPU when workers are busy; here the workers are the run: at 15 they yield to
# every process at 0 (the driver, anyone else's work on a shared machine: a nice-15
# process gets 36/1060 of a core it shares with one at 0), and a step measured 23-25 ms
# in actors against 17 ms in a plain loop. Ray's services idle while actors compute. A
# cluster started by `ray start` keeps its own: `RAY_worker_niceness=0 ray start ...`.
SYSTEM_CONFIG = {"max_direct_call_object_size": INLINE_BYTES, "worker_niceness": 0}


def start(configs: Iterable[RunConfig]) -> None:
    """A local Ray for this driver unless one is connected already, shipping the user's
    own modules (those of every configuration: a sweep's trials') to its workers. Ray's
    start-up sets its own SIGTERM handler (exit status 1): a caller that wants another
    must install it after this."""
    global _started
    if ray.is_initialized():
        return
    modules = sorted({m for cfg in configs for m in plugin_modules(cfg)})
    ray.init(
        include_dashboard=False,
        logging_level=logging.WARNING,
        runtime_env={"py_modules": modules} if modules else None,
        _system_config=SYSTEM_CONFIG if _new_node() else None,
    )
    _started = True


def owns_ray() -> bool:
    """Whether the Ray this process is connected to is the local one it started, which
    nothing but this driver uses."""
    return _started and ray.is_initialized()


def _new_node() -> bool:
    """Whether `ray.init()` starts a Ray of its own here rather than joining one (named by
    RAY_ADDRESS, or started by `ray start` on this machine), as Ray itself decides: only
    a new one takes a system configuration (private: checked)."""
    services = getattr(ray._private, "services", None)
    canonical = getattr(services, "canonicalize_bootstrap_address", None)
    return canonical is not None and canonical(None) is None


@atexit.register  # after Ray's own hook (registered when ray was imported): runs before it
def stop() -> None:
    """Shut down the local Ray this process started: its monitor killed outright (Ray
    would wait a second for it, then kill it), then `ray.shutdown`, which stops the rest
    (each exits within milliseconds) and leaves Ray's exit hook nothing to do."""
    global _started
    if not (_started and ray.is_initialized()):
        return
    _started = False
    timeline.mark("stop")
    node = getattr(ray._private.worker, "_global_node", None)  # private: checked
    processes = getattr(node, "all_processes", None) or {}
    for info in processes.get(_MONITOR, []):
        process = getattr(info, "process", None)
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=5)
    ray.shutdown()
