"""``python -m ggopt.examples.llm``: the old name of ``ggopt.cli.llm``."""
