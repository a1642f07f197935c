"""llama.cpp's BPE pre-tokenizers: the text is cut into words by a sequence of regexes.

Each regex of a sequence runs inside every piece the previous one left, and the text between
its matches stays as pieces of their own (llama.cpp's ``unicode_regex_split``). The regexes
are llama.cpp's (``llm_tokenizer_bpe``), with ``\\p{L}``, ``\\p{N}``, ``\\p{P}``, ``\\s``
replaced by llama.cpp's own codepoint classes (:mod:`ggopt.tokenizers.unicode`) and ``$`` by
``\\Z`` (std::regex's end of input).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import regex

from ggopt.errors import InvalidValueError
from ggopt.tokenizers.unicode import class_table, llama_set

try:
    import ggopt._kernels._pretok as _pretok_module

    _pretok: Any = _pretok_module
except ImportError:  # not built: the regex path gives the same words, slower
    _pretok = None

__all__ = ["PreTokenizer", "pre_tokenizer", "PRE_TOKENIZERS"]

# llama.cpp names this one without the final ``|\s+`` but runs it through code that
# behaves as if it were there (``unicode_regex_split_custom_gpt2``)
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
           r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# written with escapes: the literal characters of llama.cpp's source are easily normalised
_CJK = r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DEEPSEEK_LLM = (
    r"[\r\n]",
    r"\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    r"\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
    r"\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5"
    r"\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    r"\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
    r"\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc"
    r"\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    r"\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    r"\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
    r"\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
    r"\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a"
    r"\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    r"\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
    r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"(?<!\s)\s+$",  # llama.cpp's \s+$; only from a run's start: linear, same matches
    _CJK,
    r"\p{N}+",
)
_DEEPSEEK_CODER = (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")
_FALCON = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"[0-9][0-9][0-9]")


@dataclass(frozen=True)
class _Kind:
    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a word that is a token is taken whole (llama.cpp's flag)
    add_bos: bool | None = None  # the default before tokenizer.ggml.add_bos_token is read
    scan: tuple[int, bool] | None = None  # (kind, digits_first) of ggopt._kernels._pretok


_GPT2_KIND = _Kind((_GPT2,), scan=(0, False))
_STARCODER_KIND = _Kind((r"\p{N}", _GPT2), scan=(0, True))
_LLAMA3_KIND = _Kind((_LLAMA3,), ignore_merges=True, add_bos=True, scan=(1, False))

#: The ``tokenizer.ggml.pre`` names ggopt implements (llama.cpp's names; checked against
#: llama.cpp's conformance files, see tests/tokenizers/test_conformance.py).
PRE_TOKENIZERS: dict[str, _Kind] = {
    "gpt-2": _GPT2_KIND,
    "mpt": _GPT2_KIND,
    "llama-bpe": _LLAMA3_KIND,
    "llama3": _LLAMA3_KIND,
    "llama-v3": _LLAMA3_KIND,
    "smollm": _STARCODER_KIND,
    "starcoder": _STARCODER_KIND,
    "refact": _STARCODER_KIND,
    "command-r": _STARCODER_KIND,
    "qwen2": _Kind((_QWEN2,), scan=(2, False)),
    "deepseek-r1-qwen": _Kind((_QWEN2,), scan=(2, False)),
    "deepseek-llm": _Kind(_DEEPSEEK_LLM),
    "deepseek-coder": _Kind(_DEEPSEEK_CODER),
    "falcon": _Kind(_FALCON),
}


def _translate(pattern: str) -> str:
    """llama.cpp's regex syntax to the ``regex`` package's (V1), with llama.cpp's classes."""
    out: list[str] = []
    inside = False
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt == "p" and pattern.startswith("{", i + 2):
                end = pattern.index("}", i)
                out.append(llama_set(pattern[i + 3:end]))
                i = end + 1
                continue
            if nxt == "s":
                out.append(llama_set("s"))
            elif nxt == "S" and not inside:
                out.append(f"[^{llama_set('s')[1:-1]}]")
            else:
                out.append(pattern[i:i + 2])
            i += 2
            continue
        if c == "[":
            inside = True
        elif c == "]":
            inside = False
        elif c == "$" and not inside:
            c = r"\Z"
        out.append(c)
        i += 1
    return "".join(out)


class PreTokenizer:
    """Splits text (codepoints) into words as llama.cpp's pre-tokenizer ``name`` does."""

    def __init__(self, name: str) -> None:
        kind = PRE_TOKENIZERS[name]
        self.name = name
        self.ignore_merges = kind.ignore_merges
        self.add_bos = kind.add_bos
        self._regexes = kind.regexes
        self._scan = kind.scan if _pretok is not None else None
        self._compiled: list[regex.Pattern[str]] | None = None

    def split(self, text: str) -> list[str]:
        if self._scan is not None and _pretok is not None:
            return list(_pretok.split(text, class_table(), *self._scan))
        return self.split_regex(text)

    def split_regex(self, text: str) -> list[str]:
        """``split`` by the ``regex`` package (the reference the C scanner is tested against)."""
        if self._compiled is None:
            self._compiled = [regex.compile(_translate(p), regex.V1) for p in self._regexes]
        pieces = [text] if text else []
        for step in self._compiled:
            out: list[str] = []
            for piece in pieces:
                words = step.findall(piece)
                if sum(map(len, words)) == len(piece):  # the matches cover the piece
                    out += words
                    continue
                start = 0
                for m in step.finditer(piece):
                    if m.start() > start:
                        out.append(piece[start:m.start()])
                    out.append(m.group())
                    start = m.end()
                if start < len(piece):
                    out.append(piece[start:])
            pieces = out
        return pieces


def pre_tokenizer(name: str | None) -> PreTokenizer:
    """The pre-tokenizer of ``tokenizer.ggml.pre`` = ``name``; others are refused."""
    if name is None:
        raise InvalidValueError(
            "tokenizer.ggml.pre: missing; llama.cpp then falls back to its 'default' regexes "
            "(with a warning that generation quality degrades), which ggopt does not "
            f"implement; implemented: {', '.join(sorted(PRE_TOKENIZERS))}")
    if name not in PRE_TOKENIZERS:
        raise InvalidValueError(
            f"tokenizer.ggml.pre: pre-tokenizer {name!r} is not implemented in ggopt "
            f"(implemented: {', '.join(sorted(PRE_TOKENIZERS))})")
    return PreTokenizer(name)
