"""Serving benchmarks: ``vllm serve`` lifecycle, ``vllm bench serve`` driver, TPOT tables and the
greedy output check. Modules: config (TOML schema), lifecycle (processes), bench (runs),
results (parsing vLLM's JSON), table (TPOT table), check (greedy fixture comparison)."""
