"""prune and rekey: plans, --apply beside running JAX processes."""
