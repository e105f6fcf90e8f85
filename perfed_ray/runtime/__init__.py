"""Ray runtime: user actors, placement, the driver-side coordinator, one simulation."""
