"""The old module names of the command lines, kept so that ``python -m ggopt.examples.mnist``
(``llm``, ``finetune``) still runs: each calls :mod:`ggopt.cli`'s ``main`` (the ``ggopt``
command)."""
