"""Table 1 of Fallah, Mokhtari, Ozdaglar (NeurIPS 2020): the figures to reproduce.

Test accuracy (%) after one local step, per row (dataset, partition, tau,
alpha) and algorithm, quoted from the paper; the other settings of every row
are PROTOCOL.md's (n = 50, r = 0.2, K = 1000, beta = 0.001, D = 40). The
paper never ran exact Per-FedAvg, so it has no figure here.
"""

from __future__ import annotations

Row = tuple[str, str, int, float]  # dataset, partition, tau, alpha

ROW_KEYS = ("dataset", "partition", "tau", "alpha")
PAPER_ALGORITHMS = ("fedavg", "perfedavg-fo", "perfedavg-hf")

TABLE1: dict[Row, dict[str, float]] = {
    row: dict(zip(PAPER_ALGORITHMS, figures, strict=True))
    for row, figures in {
        ("mnist", "paper", 10, 0.01): (75.96, 78.00, 79.85),
        ("mnist", "paper", 4, 0.01): (60.18, 64.55, 70.94),
        ("cifar10", "paper", 10, 0.001): (40.49, 46.98, 50.44),
        ("cifar10", "paper", 4, 0.001): (38.38, 34.04, 43.73),
        ("cifar10", "paper", 4, 0.01): (35.97, 25.32, 46.32),
        ("cifar10", "paper-diff", 4, 0.01): (58.59, 37.71, 71.25),
    }.items()
}


def describe(row: Row) -> str:
    """A row as the paper names it: 'MNIST, tau=10, alpha=0.01 (diff. hetero.)'."""
    dataset, partition, tau, alpha = row
    name = {"mnist": "MNIST", "cifar10": "CIFAR-10"}.get(dataset, dataset)
    extra = {"paper": "", "paper-diff": ", diff. hetero."}.get(partition, f", {partition}")
    return f"{name}, tau={tau}, alpha={alpha:g}{extra}"
