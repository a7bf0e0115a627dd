"""The scan's finding rules, by family; ``registry.SCAN_RULES`` runs them in one order, each
bound to the finding kinds it raises."""
