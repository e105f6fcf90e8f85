"""A user's own stateful method, written outside the package as any plug-in would be:
FedAvg whose users keep their SGD momentum from round to round (per-user state)."""

from perfed_ray.algorithms import Algorithm, sgd, tree_map


class PersistentMomentum(Algorithm):
    """Local SGD with heavy-ball momentum mu = 0.9; each user's momentum buffer persists
    across the rounds it is sampled in, on the actor that hosts it."""

    mu = 0.9

    def init_user_state(self, server):
        return tree_map(lambda v: v * 0, server)

    def client_init(self, ops, server, momentum):
        return {"w": server, "m": momentum}

    def client_step(self, ops, state, batches):
        g, loss = ops.grad_and_loss(state["w"], batches[0])
        m = tree_map(lambda m, g: self.mu * m + g, state["m"], g)
        return {"w": sgd(state["w"], m, self.beta), "m": m}, loss

    def client_final(self, ops, server, state):
        return state["w"], state["m"]
