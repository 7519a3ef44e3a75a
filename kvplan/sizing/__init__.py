"""What a model costs one rank: its tensors and weights, its per-layer caches and the bytes a step reads (with the
roofline), vLLM's non-KV memory, and the fitted step time.
"""
