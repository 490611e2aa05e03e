from .load_balancing import (
    LoadBalancingDistributedSampler,
    balanced_split,
    even_split,
    num_samples_per_replica,
)

__all__ = [
    "LoadBalancingDistributedSampler",
    "balanced_split",
    "even_split",
    "num_samples_per_replica",
]
