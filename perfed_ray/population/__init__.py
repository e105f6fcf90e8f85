"""The simulated population's devices and availability, on the simulated clock.

A user's device (:mod:`.devices`: its compute speed and bandwidth, hence how long its
task takes) and when it is online (:mod:`.availability`) are pure functions of the
run's seed and the user (and the time): keyed draws or a table, never state advanced by
each question, so no answer depends on the order questions are asked in or on which
process asks. FedScale's pickled traces become these tables through :mod:`.fedscale`
(``perfed-ray convert-fedscale``); a run reads only the tables. NumPy and pandas only:
no Ray, no torch.
"""
