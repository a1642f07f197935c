"""ggopt's command lines (thin: the work is in the library packages): ``ggopt finetune``,
``ggopt generate|eval|tokenize``, ``ggopt train``, ``ggopt mnist``."""
