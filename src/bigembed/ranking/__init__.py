"""Everything that ranks and measures: sampled ranking, full filtered ranking, the metrics."""
