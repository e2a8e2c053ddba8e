"""triton backends (being written)."""
