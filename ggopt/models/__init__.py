"""Model families ggopt builds graphs for: :mod:`ggopt.models.llama`."""
