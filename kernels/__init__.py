"""kvplan's GPU kernels, installed as `kvplan.kernels` (they need `pip install 'kvplan[gpu]'`).

Each kernel reads exactly the byte layout that `kvplan.formats` counts for its KV-cache format. This version ships
no kernel yet: the planning commands (`crossover`, `capacity`, `formats`) are analytic and need no GPU.
"""
