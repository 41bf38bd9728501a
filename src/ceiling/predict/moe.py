"""How many experts a decode step reads, and how unevenly they land on EP ranks.

With B tokens each picking k of E experts (uniformly, to first order), the expected number of
distinct experts touched is E * (1 - (1 - k/E)^B): 8 at B=1, all E at large B. Under tensor
parallelism every rank reads a 1/TP slice of each touched expert; under expert parallelism
the step waits for the rank that owns the most touched experts, which at B=1 is well above
the mean (8 experts over 8 ranks: about 2.6 on the busiest rank, not 1).
"""

from __future__ import annotations

import math


def expected_distinct(n_experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts activated by ``tokens`` tokens choosing ``top_k`` each."""
    if n_experts <= 0 or tokens <= 0:
        return 0.0
    k = min(top_k, n_experts)
    return n_experts * (1.0 - (1.0 - k / n_experts) ** tokens)


def expected_max_load(n_experts: int, distinct: float, ranks: int) -> float:
    """Expected number of touched experts on the busiest of ``ranks`` EP ranks.

    Each rank owns g = E/ranks experts; the touched set is a uniform sample of size D, so a
    rank's count is hypergeometric (mean D/ranks). The maximum over ranks is approximated by
    mean + sigma * sqrt(2 ln ranks) (Gaussian extreme), clamped to [mean, min(g, D)].
    """
    if ranks <= 1:
        return distinct
    g = n_experts / ranks
    mean = distinct / ranks
    if n_experts <= 1:
        return mean
    p = g / n_experts
    var = distinct * p * (1 - p) * max(n_experts - distinct, 0.0) / (n_experts - 1)
    est = mean + math.sqrt(max(var, 0.0)) * math.sqrt(2 * math.log(ranks))
    return max(mean, min(est, g, distinct))
