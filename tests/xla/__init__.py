"""XLA messages: GPU executables, split protos, HLO facts, the GPU sub-caches."""
