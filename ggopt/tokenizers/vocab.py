"""A vocabulary read from a GGUF's ``tokenizer.ggml.*`` keys as llama.cpp reads it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ggopt.errors import InvalidValueError, ShapeError
from ggopt.tokenizers.fields import Fields
from ggopt.tokenizers.special import AUTO_IDS, EOG_TEXTS, FORCED_USER_DEFINED, TYPE_TO_ATTR, Attr

__all__ = ["Vocab", "read_vocab", "MODELS"]

K = "tokenizer.ggml."
#: ``tokenizer.ggml.model`` values ggopt implements.
MODELS = ("gpt2", "llama", "rwkv")
# llama.cpp's default special ids per model, before the keys are read
_DEFAULT_IDS = {"llama": {"bos": 1, "eos": 2, "unk": 0}, "gpt2": {"bos": 11, "eos": 11},
                "rwkv": {}}
_ID_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "eot": "eot_token_id",
            "eom": "eom_token_id", "unk": "unknown_token_id", "sep": "seperator_token_id",
            "pad": "padding_token_id", "fim_pre": "fim_pre_token_id",
            "fim_suf": "fim_suf_token_id", "fim_mid": "fim_mid_token_id",
            "fim_pad": "fim_pad_token_id", "fim_rep": "fim_rep_token_id",
            "fim_sep": "fim_sep_token_id"}


@dataclass
class Vocab:
    model: str
    pre: str | None
    tokens: list[bytes]
    texts: list[str]  # the tokens decoded (UTF-8, undecodable bytes as surrogates)
    types: list[int]
    attrs: list[int]
    scores: list[float] | None
    merges: list[str] | None
    ids: dict[str, int | None]
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    eog: frozenset[int]
    chat_template: str | None
    special_order: list[int] = field(default_factory=list)  # longest text first


def _strings(tokens: list[bytes]) -> list[str]:
    return [t.decode("utf-8", "surrogateescape") for t in tokens]


def read_vocab(f: Fields) -> Vocab:
    """Read and check every tokenizer key; raise a GgoptError naming the first bad one."""
    model = f.string(K + "model")
    if model is None:
        raise InvalidValueError(f"{K}model: missing from the GGUF metadata")
    if model not in MODELS:
        raise InvalidValueError(f"{K}model: tokenizer model {model!r} is not implemented in "
                                f"ggopt (implemented: {', '.join(MODELS)})")
    pre = f.string(K + "pre")
    tokens = f.strings(K + "tokens")
    n = len(tokens)
    if n == 0:
        raise ShapeError(f"{K}tokens: empty vocabulary")
    types = [1] * n
    if K + "token_type" in f:
        arr = f.int_array(K + "token_type")
        if len(arr) < n:
            raise ShapeError(f"{K}token_type: {len(arr)} entries for {n} tokens")
        types = [int(t) for t in arr[:n]]
    scores = None
    if K + "scores" in f:
        arr = f.float_array(K + "scores")
        if len(arr) < n:
            raise ShapeError(f"{K}scores: {len(arr)} entries for {n} tokens")
        scores = [float(s) for s in arr[:n]]
    merges = None
    if model == "gpt2":
        if K + "merges" not in f:
            raise InvalidValueError(f"{K}merges: missing; a gpt2 (BPE) vocabulary needs its "
                                    "merges")
        merges = _strings(f.strings(K + "merges"))
    tokens = [t if t else f"[EMPTY_{i}]".encode() for i, t in enumerate(tokens)]
    if len(set(tokens)) != n:
        seen: dict[bytes, int] = {}
        for i, t in enumerate(tokens):
            if t in seen:
                raise InvalidValueError(f"{K}tokens: {t!r} at {seen[t]} and {i} (llama.cpp "
                                        "requires distinct tokens)")
            seen[t] = i
    attrs = [TYPE_TO_ATTR.get(t, Attr.UNDEFINED) for t in types]
    ids: dict[str, int | None] = {name: None for name in _ID_KEYS}
    for name, value in _DEFAULT_IDS[model].items():
        ids[name] = value if value < n else None
    for name, key in _ID_KEYS.items():
        value = f.token_id(K + key)
        if value is not None and value < n:  # llama.cpp keeps the default for one out of range
            ids[name] = value
    add_space_prefix = model == "llama"
    add_bos = model == "llama"
    add_space_prefix = f.boolean(K + "add_space_prefix", add_space_prefix)
    texts = _strings(tokens)
    by_text = {t: i for i, t in enumerate(texts)}
    for name, candidates in AUTO_IDS.items():
        if ids[name] is None:
            found = [by_text[c] for c in candidates if c in by_text]
            if found:
                ids[name] = min(found)
                attrs[ids[name]] |= Attr.CONTROL  # type: ignore[index]
    for i, a in enumerate(attrs):
        if a & Attr.CONTROL and "unused" in texts[i]:
            attrs[i] |= Attr.UNUSED
    eog = {i for i in (ids["fim_pad"], ids["fim_rep"], ids["fim_sep"]) if i is not None}
    for text in EOG_TEXTS:
        if text in by_text:
            eog.add(by_text[text])
            attrs[by_text[text]] |= Attr.CONTROL
    for text in FORCED_USER_DEFINED:
        if text in by_text:
            attrs[by_text[text]] = Attr.USER_DEFINED
    eog |= {i for i in (ids["eos"], ids["eot"], ids["eom"]) if i is not None}
    eog_texts = {texts[i] for i in eog}
    if "<|end|>" in eog_texts and (("<|return|>" in eog_texts and "<|call|>" in eog_texts)
                                    or ({"<|call|>", "<|calls|>"} & eog_texts
                                        and "<|flush|>" in eog_texts)):
        eog.discard(by_text["<|end|>"])
        attrs[by_text["<|end|>"]] = Attr.USER_DEFINED
    if "</s>" in eog_texts and eog_texts & {"<|tool_response>", "<|plamo:eos|>"}:
        eog.discard(by_text["</s>"])
        attrs[by_text["</s>"]] = Attr.NORMAL
    if model == "gpt2":
        add_bos = pre in ("llama-bpe", "llama3", "llama-v3")
    if model == "rwkv":
        add_bos = False
    add_bos = f.boolean(K + "add_bos_token", add_bos)
    add_eos = f.boolean(K + "add_eos_token", False)
    special_order = sorted((i for i, a in enumerate(attrs)
                            if a & (Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN)),
                           key=lambda i: (-len(tokens[i]), i))
    name = (f.string("general.name") or "").lower()
    if "phi-3" in name or "phi3" in name:  # llama.cpp strips spaces after Phi-3's specials
        for i in special_order:
            attrs[i] |= Attr.RSTRIP
        for text, on in (("</s>", True), ("<unk>", False), ("<s>", False),
                         ("<|endoftext|>", False)):
            if text in by_text:
                i = by_text[text]
                attrs[i] = attrs[i] | Attr.RSTRIP if on else attrs[i] & ~Attr.RSTRIP
    for flag, name_ in ((add_bos, "bos"), (add_eos, "eos")):
        if flag and ids[name_] is None:
            raise InvalidValueError(f"{K}add_{name_}_token: set, but the vocabulary has no "
                                    f"{name_} token")
    return Vocab(model=model, pre=pre, tokens=tokens, texts=texts, types=types, attrs=attrs,
                 scores=scores, merges=merges, ids=ids, add_bos=add_bos, add_eos=add_eos,
                 add_space_prefix=add_space_prefix, eog=frozenset(eog),
                 chat_template=f.string("tokenizer.chat_template"),
                 special_order=special_order)
