"""Command lines built on ggopt's public API (thin: the work is in the library packages).

- :mod:`ggopt.examples.mnist`: ggml's MNIST example (``python -m ggopt.examples.mnist``),
  fully connected and convolutional models trained with :func:`ggopt.opt.fit`, GGUF in and out.
- :mod:`ggopt.examples.llm`: ``train`` a byte-level llama the way llama.cpp trains (``llm_train``,
  ``llm_data``), and ``generate`` / ``eval`` / ``tokenize`` with any llama GGUF (``llm_infer``,
  over :mod:`ggopt.models.llama`, :mod:`ggopt.lm` and :mod:`ggopt.tokenizers`).
- :mod:`ggopt.examples.finetune`: fine-tune a pretrained llama GGUF, full or LoRA, on text or
  chat data (:mod:`ggopt.lm.finetune`), and write the model or a llama.cpp adapter.
- ``training_cli``: the checkpoint and learning-rate-schedule options the examples share.
"""
