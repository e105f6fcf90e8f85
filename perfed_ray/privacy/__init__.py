"""User-level differential privacy (issue 37): the accountant (`accounting`), which turns
what a run does (central or local noise, Poisson or fixed-size cohorts, its population
and rounds) into the epsilon it spends, and the noise multiplier for a target epsilon.
Pure maths on Google's `dp-accounting`: nothing here knows Ray, torch or the users."""
