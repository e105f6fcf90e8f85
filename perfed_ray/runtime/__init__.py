"""Ray runtime: user actors, placement, the rounds and their transport, one simulation."""
