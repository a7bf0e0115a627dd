"""Changing a cache safely: the plan of actions (prune's rules, rekey), applied under JAX's lock."""
