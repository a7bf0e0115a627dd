"""The scan's finding rules, by family; each returns findings from the listing and entries."""
