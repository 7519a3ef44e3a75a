"""What a KV format costs in accuracy: each format's store on the torch references (formats), the figures compared
(metrics), a transformers model run with its cache stored in each format (run), and K/V drawn with the structure
the literature reports, for a first look without a model (synthetic). Needs torch (and transformers for a model):
the `quality` extra."""
