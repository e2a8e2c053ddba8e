"""Correctness: what a correct output is (:mod:`.verdict`: error limits from the dtypes' rounding),
the input sets that expose a wrong one (:mod:`.input_sets`: random, needles, peaky, flat), and
graph-check (:mod:`.graph_check`: a captured CUDA graph replayed at other lengths, against the call
prepared for each)."""
