"""``python -m ggopt.examples.finetune``: the old name of ``ggopt.cli.finetune``."""
