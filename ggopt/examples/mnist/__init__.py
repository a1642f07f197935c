"""``python -m ggopt.examples.mnist``: the old name of ``ggopt.cli.mnist``."""
