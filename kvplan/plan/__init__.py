"""The questions: vLLM's and SGLang's KV pools (capacity), crossover, throughput and the simulated serving benchmark,
and the sweep.
"""
