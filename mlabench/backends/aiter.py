"""aiter backends (being written)."""
