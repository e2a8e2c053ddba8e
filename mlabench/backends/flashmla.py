"""flashmla backends (being written)."""
