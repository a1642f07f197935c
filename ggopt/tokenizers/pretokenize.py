"""llama.cpp's BPE pre-tokenizers: the text is cut into words by a sequence of regexes.

Each regex of a sequence runs inside every piece the previous one left, and the text between
its matches stays as pieces of their own (llama.cpp's ``unicode_regex_split``). The regexes
are llama.cpp's (``llm_tokenizer_bpe``), with ``\\p{L}``, ``\\p{N}``, ``\\p{P}``, ``\\s``
replaced by llama.cpp's own codepoint classes (:mod:`ggopt.tokenizers.unicode`) and ``$`` by
``\\Z`` (std::regex's end of input).
"""

from __future__ import annotations

from dataclasses import dataclass

import regex

from ggopt.errors import InvalidValueError
from ggopt.tokenizers.unicode import CLASSES

__all__ = ["PreTokenizer", "pre_tokenizer", "PRE_TOKENIZERS"]

# llama.cpp names this one without the final ``|\s+`` but runs it through code that
# behaves as if it were there (``unicode_regex_split_custom_gpt2``)
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
           r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK_LLM = (
    r"[\r\n]",
    r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",  # noqa: E501
    r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
    r"\s+$",
    r"[一-龥ࠀ-一가-퟿]+",
    r"\p{N}+",
)
_DEEPSEEK_CODER = (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}")
_FALCON = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"[0-9][0-9][0-9]")


@dataclass(frozen=True)
class _Kind:
    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a word that is a token is taken whole (llama.cpp's flag)
    add_bos: bool | None = None  # the default before tokenizer.ggml.add_bos_token is read


_GPT2_KIND = _Kind((_GPT2,))
_STARCODER_KIND = _Kind((r"\p{N}", _GPT2))
_LLAMA3_KIND = _Kind((_LLAMA3,), ignore_merges=True, add_bos=True)

#: The ``tokenizer.ggml.pre`` names ggopt implements (llama.cpp's names; checked against
#: llama.cpp's conformance files, see tests/test_tokenizers_conformance.py).
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
    "qwen2": _Kind((_QWEN2,)),
    "deepseek-r1-qwen": _Kind((_QWEN2,)),
    "deepseek-llm": _Kind(_DEEPSEEK_LLM),
    "deepseek-coder": _Kind(_DEEPSEEK_CODER),
    "falcon": _Kind(_FALCON),
}


def _translate(pattern: str) -> str:
    """llama.cpp's regex syntax to the ``regex`` package's, with llama.cpp's classes."""
    out: list[str] = []
    inside = False
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt == "p" and pattern.startswith("{", i + 2):
                end = pattern.index("}", i)
                body = CLASSES[pattern[i + 3:end]]
                out.append(body if inside else f"[{body}]")
                i = end + 1
                continue
            if nxt == "s":
                out.append(CLASSES["s"] if inside else f"[{CLASSES['s']}]")
            elif nxt == "S" and not inside:
                out.append(f"[^{CLASSES['s']}]")
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
        self._steps = [regex.compile(_translate(p), regex.V0) for p in kind.regexes]

    def split(self, text: str) -> list[str]:
        pieces = [text] if text else []
        for step in self._steps:
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
