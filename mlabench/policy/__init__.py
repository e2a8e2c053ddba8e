"""Every split-count rule in one place: the cap and the entry rules (:mod:`.rules`), the public
heuristics of other libraries (:mod:`.heuristics`, vLLM's rule among them, the split-KV backends'
default), the tuned policy the tune command writes (:mod:`.tuned`) and its C++/Python exports
(:mod:`.exports`), and the device-side lookup table a backend reads at launch (:mod:`.device_table`)."""
