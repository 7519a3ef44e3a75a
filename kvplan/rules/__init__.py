"""What each engine does, as data per release: vLLM's and SGLang's defaults, backends and limits."""
