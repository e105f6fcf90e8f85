"""Sweeps: many simulations as the trials of one Ray Tune experiment (`perfed-ray sweep`).

- :mod:`~perfed_ray.sweep.spec` reads a sweep file into the trials' validated
  configurations and what each trial reserves, before Ray starts;
- :mod:`~perfed_ray.sweep.trial` is the Tune trainable: one simulation per trial,
  a result after every round, Tune's stop decisions turned into the run's status;
- :mod:`~perfed_ray.sweep.runner` builds the Tuner (resources, early stopping),
  resumes a stopped sweep and reads its outcome, the step-size search included.

Every trial writes the same Parquet tables as `perfed-ray run` into the sweep's
results folder, its run id the sweep's name and the trial's number; Tune's own
state lives beside them in ``<out>/sweeps/<name>/``.
"""

ENDED = ("finished", "diverged", "stopped")  # a trial whose run ended so is not run again
