"""Optimisers: a client's (the local steps of methods that use one, on parameter trees,
under every engine) and the server's (how the global model moves towards the users'
aggregate, on the flat vectors that travel). Names are registered in
:data:`perfed_ray.registry.CLIENT_OPTIMIZERS` and :data:`perfed_ray.registry.SERVER_OPTIMIZERS`;
each declares its own settings (:mod:`perfed_ray.config.settings`)."""
