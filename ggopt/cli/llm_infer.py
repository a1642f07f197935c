"""The ``generate``, ``eval`` and ``tokenize`` commands of ``ggopt``,
for any llama GGUF ggopt loads (SmolLM2 and the like, and ggopt's own byte-level models).

``generate`` samples with a KV cache (:mod:`ggopt.lm.generation`), ``eval`` prints perplexity as
``llama-perplexity`` computes it (:mod:`ggopt.lm.perplexity`), ``tokenize`` prints token ids
as ``llama-tokenize --ids`` does. Results go to stdout, notes to stderr.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from .. import set_n_threads
from ..errors import InvalidValueError, ShapeError
from ..lm import SamplingParams, generate, lora, perplexity, preflight
from ..models import Model, load
from ..models.llama.compute import COMPUTE_TYPES
from ..models.llama.compute import HELP as COMPUTE_HELP
from ..models.llama.mapped import BASE_TYPES
from ..models.llama.vocab import require, tokenizer_of
from ..opt.progress import write_progress
from ..tokenizers.templates import BUILTIN, resolve_template
from .common import positive

__all__ = ["add_commands", "read_bytes"]

EVAL_CTX = 512


def read_bytes(paths: list[str], option: str) -> bytes:
    """The concatenated bytes of ``paths`` (ShapeError naming ``option`` when unreadable)."""
    parts = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                parts.append(f.read())
        except OSError as exc:
            raise ShapeError(f"{option} {path!r}: {exc.strerror or exc}") from None
    return b"".join(parts)


def _adapters(args: argparse.Namespace) -> list[tuple[str, float]]:
    """``(path, strength)`` of every --lora (1) and --lora-scaled, each file checked readable."""
    given = [(path, 1.0) for path in args.lora or ()]
    given += [(path, _strength(scale)) for path, scale in args.lora_scaled or ()]
    for path, _ in given:  # a missing file named before the model loads
        if not os.access(path, os.R_OK) or os.path.isdir(path):
            raise ShapeError(f"--lora {path!r}: not a readable file")
    return given


def _strength(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InvalidValueError(f"--lora-scaled: the scale must be a number, got {text!r}") \
            from None
    if not math.isfinite(value):
        raise InvalidValueError(f"--lora-scaled: the scale must be finite, got {text!r}")
    return value


FLOAT_ORDERS = ("ggml", "ggopt")
FLOAT_ORDER_HELP = ("ggml (the default with --base-type keep on a file of Q4_0/Q4_1/Q5_0/Q5_1/"
                    "Q8_0 and K-quant matrices): round every op as llama.cpp's x86 AVX2 build "
                    "does, for its perplexity bit for bit on such files (and on F32 ones: "
                    "docs/ggml-order.md); ggopt (the default otherwise): ggopt's own order, "
                    "the same values to float rounding, about 2x faster")


def _load(args: argparse.Namespace) -> Model:
    preflight.model_info(args.model)  # an adapter given as the model: named, before the load
    adapters = _adapters(args) if hasattr(args, "lora") else []
    if args.threads is not None:
        set_n_threads(args.threads)
    order = getattr(args, "float_order", None)
    model = load(args.model, base_type=getattr(args, "base_type", "f32"),
                 progress=False if args.no_progress else None,
                 compute_type=getattr(args, "compute_type", "f32"),
                 ggml_order=None if order is None else order == "ggml")
    if adapters:
        lora.apply(model.net, [(lora.load(path, model.net), s) for path, s in adapters])
        print(f"main: {len(adapters)} LoRA adapter(s): "
              f"{', '.join(f'{path} x{s:g}' for path, s in adapters)}", file=sys.stderr)
    print(f"main: loaded {args.model} ({model.cfg.n_layer} layers, {model.cfg.n_vocab} "
          f"tokens, {', '.join(f'{n} {k}' for k, n in model.tensor_types.items())}) in "
          f"{model.load_seconds:.2f} s", file=sys.stderr)
    return model


def _prompt_bytes(args: argparse.Namespace) -> bytes:
    if args.prompt_file is not None:
        return read_bytes([args.prompt_file], "--prompt-file")
    return os.fsencode(args.prompt)  # any bytes: invalid UTF-8 arrives as surrogate escapes


def _generate(args: argparse.Namespace) -> int:
    params = SamplingParams(temp=args.temp, top_k=args.top_k, top_p=args.top_p,
                            seed=args.seed)
    if args.ctx is not None and args.ctx < 1:
        raise InvalidValueError(f"--ctx: expected a positive int, got {args.ctx}")
    text = _prompt_bytes(args)
    if args.chat_template is not None:
        if not args.chat:
            raise InvalidValueError("--chat-template: it applies to --chat (give --chat)")
        args.template = resolve_template(args.chat_template)
    model = _load(args)
    tok = model.require_tokenizer()
    if args.chat:
        message = {"role": "user", "content": text.decode("utf-8", "replace")}
        if args.chat_template is not None:
            tok = tok.with_chat_template(args.template)
        if not tok.chat_template:
            raise InvalidValueError("--chat: the model has no tokenizer.chat_template (give "
                                    "--chat-template FILE|NAME)")
        prompt = tok.apply_chat_template([message], add_generation_prompt=True)
        ids = tok.encode(prompt, add_special=False, parse_special=True)
    else:
        ids = tok.encode(text, add_special=True, parse_special=False)
    if not ids:
        raise ShapeError("--prompt: expected at least one token")
    out = sys.stdout
    out.write(tok.decode(ids).decode("utf-8", errors="replace"))
    result = generate(model, ids, args.n, params, eog=tok.eog, n_ctx=args.ctx)
    out.write(tok.decode(result.tokens).decode("utf-8", errors="replace") + "\n")
    print(f"main: prompt {result.n_prompt} tokens in {result.prompt_seconds:.2f} s; generated "
          f"{len(result.tokens)} tokens in {result.gen_seconds:.2f} s, "
          f"{result.tokens_per_second:.1f} tokens/s (stop: {result.stop})")
    return 0


def _eval(args: argparse.Namespace) -> int:
    text = read_bytes(args.text, "--text")
    model = _load(args)
    tok = model.require_tokenizer()
    n_ctx = args.ctx or min(model.cfg.n_ctx, EVAL_CTX)
    ids = tok.encode(text, add_special=True, parse_special=False)
    bos = tok.bos if tok.add_bos else None  # llama-perplexity: llama_vocab_get_add_bos

    def progress(i: int, n: int, ppl: float) -> None:
        write_progress(sys.stderr, f"\reval: [{i}/{n}] ppl {ppl:.4f}" + ("\n" if i == n else ""),
                       i, n)

    r = perplexity(model, ids, n_ctx, bos=bos, progress=None if args.no_progress else progress)
    unit = "byte" if model.is_bytes else "token"
    print(f"main: {len(ids)} tokens, {r.n_chunks} windows of {n_ctx}, {r.n_scored} scored; "
          f"{r.tokens_per_second:.0f} tokens/s")
    print(f"loss={r.nll:.6f} bits per {unit}={r.nll / math.log(2):.4f}")
    print(f"perplexity: {r.ppl:.4f} +/- {r.ppl_err:.4f}")
    return 0


def _tokenize(args: argparse.Namespace) -> int:
    if (args.text is None) == (args.prompt is None):
        raise ShapeError("tokenize: give exactly one of --text FILE and --prompt TEXT")
    text = read_bytes([args.text], "--text") if args.text else os.fsencode(args.prompt)
    preflight.model_info(args.model)  # the keys and tensor list: a model, not an adapter
    tok = require(tokenizer_of(args.model), f"llm {args.model!r}")  # the vocabulary only
    ids = tok.encode(text, add_special=not args.no_special,
                                           parse_special=args.parse_special)
    print(ids)
    return 0


def _add_lora(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lora", action="append", metavar="FILE.gguf",
                   help="apply this LoRA adapter GGUF (llama.cpp's --lora; repeatable; "
                        "default: none)")
    p.add_argument("--lora-scaled", action="append", nargs=2, metavar=("FILE.gguf", "SCALE"),
                   help="apply this LoRA adapter at strength SCALE (llama.cpp's "
                        "--lora-scaled; repeatable; default: none)")


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``generate``, ``eval`` and ``tokenize`` to the subcommand parser ``sub``."""
    s = SamplingParams()
    ge = sub.add_parser("generate", help="sample text from a model (KV cache)")
    ge.add_argument("--model", required=True, metavar="FILE.gguf")
    ge.add_argument("--prompt", default="def ", help="prompt text, any bytes (default 'def ')")
    ge.add_argument("--prompt-file", metavar="FILE", help="read the prompt from FILE")
    ge.add_argument("-n", type=positive, default=200, help="tokens to generate (default 200)")
    ge.add_argument("--temp", type=float, default=s.temp,
                    help=f"temperature; 0 = greedy (the most likely token); negative values "
                         f"are refused (default {s.temp})")
    ge.add_argument("--top-k", type=int, default=s.top_k,
                    help=f"sample among the k most likely tokens; 0 = all (default {s.top_k})")
    ge.add_argument("--top-p", type=float, default=s.top_p,
                    help=f"nucleus sampling, 1 = off (default {s.top_p})")
    ge.add_argument("--seed", type=int, default=s.seed,
                    help="sampling seed, 0 .. 2**32-1 (default 0)")
    ge.add_argument("--ctx", type=int, help="cap on the KV cache (default: the model's "
                    "context length; the cache holds prompt + -n tokens at most)")
    ge.add_argument("--chat", action="store_true",
                    help="wrap the prompt in the model's chat template as a user message")
    ge.add_argument("--chat-template", metavar="FILE|NAME",
                    help="with --chat: this template instead of the model's "
                         "tokenizer.chat_template: a jinja file (the same sandbox and limits "
                         f"as a GGUF's template) or a built-in name ({', '.join(BUILTIN)}: "
                         "Gemma 3's turns) (default: the model's own)")
    ge.add_argument("--threads", type=positive, metavar="N", help="CPU threads")
    ge.add_argument("--no-progress", action="store_true",
                    help="no progress on stderr (loading)")
    ge.add_argument("--base-type", choices=BASE_TYPES, default="f32",
                    help="f32 (default): weights dequantized at load; keep: as the file "
                         "stores them (quantized, F16, BF16: mapped), multiplied as "
                         "llama.cpp's CPU backend does (activations rounded to 8 bits)")
    ge.add_argument("--compute-type", choices=COMPUTE_TYPES, default="f32", help=COMPUTE_HELP)
    _add_lora(ge)
    ge.set_defaults(func=_generate)

    ev = sub.add_parser("eval", help="perplexity on text, as llama-perplexity")
    ev.add_argument("--model", required=True, metavar="FILE.gguf")
    ev.add_argument("--text", required=True, nargs="+", metavar="FILE")
    ev.add_argument("--ctx", type=positive, help=f"window size (default: the model's context "
                    f"length, at most {EVAL_CTX}); the text needs 2 windows at least")
    ev.add_argument("--threads", type=positive, metavar="N", help="CPU threads")
    ev.add_argument("--no-progress", action="store_true",
                    help="no progress on stderr (loading, evaluating)")
    ev.add_argument("--base-type", choices=BASE_TYPES, default="f32",
                    help="f32 (default): weights dequantized at load; keep: as the file "
                         "stores them (quantized, F16, BF16: mapped), multiplied as "
                         "llama.cpp's CPU backend does (activations rounded to 8 bits)")
    ev.add_argument("--compute-type", choices=COMPUTE_TYPES, default="f32", help=COMPUTE_HELP)
    ev.add_argument("--float-order", choices=FLOAT_ORDERS, help=FLOAT_ORDER_HELP)
    _add_lora(ev)
    ev.set_defaults(func=_eval)

    to = sub.add_parser("tokenize", help="print token ids as llama-tokenize --ids")
    to.add_argument("--model", required=True, metavar="FILE.gguf")
    to.add_argument("--text", metavar="FILE", help="the text to tokenize (any bytes)")
    to.add_argument("--prompt", help="or the text itself")
    to.add_argument("--no-special", action="store_true", help="do not add BOS/EOS")
    to.add_argument("--parse-special", action="store_true",
                    help="match control tokens such as <|im_start|> in the text")
    to.add_argument("--threads", type=positive, metavar="N", help="CPU threads")
    to.add_argument("--no-progress", action="store_true",
                    help="no progress on stderr (loading)")
    to.set_defaults(func=_tokenize)
