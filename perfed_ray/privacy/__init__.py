"""User-level differential privacy (issue 37): the mechanisms (`mechanisms`: none,
central, local), their steps on each user's update on the actors (`clipping`), and the
accountant (`accounting`), which turns what a run does (central or local noise, Poisson
or fixed-size cohorts, its population and rounds) into the epsilon it spends and the
noise multiplier for a target epsilon: pure maths on Google's `dp-accounting`, knowing
nothing of Ray, torch or the users."""

# Adaptive clipping's statistic: what clipping (on the actors) counts and the central
# mechanism (on the driver) reads; here, so that neither module imports the other for it.
UNCLIPPED = "unclipped_centred"
