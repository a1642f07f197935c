"""UTF-8 and codepoint classes exactly as llama.cpp's tokenizers see them.

llama.cpp decodes text byte by byte: a byte that does not start a complete sequence becomes
U+FFFD and only that byte is consumed; it does not reject overlong forms or surrogates. The
codepoint classes (``\\p{L}``, ``\\p{N}``, ``\\s``, ...) come from llama.cpp's own table
(:mod:`ggopt.tokenizers._unicode_ranges`), written out as explicit ranges for the ``regex``
package so that its Unicode version does not matter.
"""

from __future__ import annotations

import functools

import numpy as np
import regex

from ggopt.errors import InvalidValueError
from ggopt.tokenizers import _unicode_ranges as _r

__all__ = ["decode_utf8", "encode_utf8", "llama_set", "class_table", "utf8_len"]


def _ranges_body(ranges: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> str:
    return "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)


def _mask_ranges(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return [(int(a), int(b) - 1) for a, b in zip(edges[::2], edges[1::2])]


@functools.cache
def _everything() -> str:
    cpts = np.concatenate((np.arange(0xD800), np.arange(0xE000, 0x110000))).astype("<u4")
    return cpts.tobytes().decode("utf-32-le")


@functools.cache
def llama_set(prop: str) -> str:
    """A ``regex`` V1 set (bracketed) equal to llama.cpp's class ``\\p{prop}`` (``s``: its
    whitespace): the package's own fast property, with the codepoints its Unicode version
    classifies differently taken out or added."""
    if prop == "s":
        return f"[{_ranges_body(_r.WHITESPACE)}]"
    ranges = {"L": _r.LETTER, "N": _r.NUMBER, "P": _r.PUNCTUATION, "S": _r.SYMBOL,
              "M": _r.ACCENT_MARK}[prop]
    ours = np.zeros(0x110000, bool)
    for a, b in ranges:
        ours[a:b + 1] = True
    theirs = np.zeros(0x110000, bool)
    for m in regex.finditer(f"\\p{{{prop}}}+", _everything()):
        a, b = m.span()  # positions past the surrogates are 0x800 lower than the codepoints
        shift = 0x800 if a >= 0xD800 else 0
        theirs[a + shift:b + shift] = True
    out = f"\\p{{{prop}}}"
    if (theirs & ~ours).any():
        out = f"[{out}--[{_ranges_body(_mask_ranges(theirs & ~ours))}]]"
    if (ours & ~theirs).any():
        out = f"[{out}{_ranges_body(_mask_ranges(ours & ~theirs))}]"
    return out if out.startswith("[") else f"[{out}]"


@functools.cache
def class_table() -> np.ndarray:
    """llama.cpp's class of every codepoint: bit 0 letter, 1 number, 2 whitespace."""
    table = np.zeros(0x110000, np.uint8)
    for bit, ranges in ((1, _r.LETTER), (2, _r.NUMBER), (4, _r.WHITESPACE)):
        for a, b in ranges:
            table[a:b + 1] |= bit
    return table


_LEAD_LEN = bytes([1] * 12 + [2, 2, 3, 4])


def utf8_len(lead: int) -> int:
    """The sequence length llama.cpp assumes from a lead byte (``unicode_len_utf8``)."""
    return _LEAD_LEN[lead >> 4]


def _decode_slow(data: bytes) -> str:
    out: list[str] = []
    i, n = 0, len(data)
    while i < n:
        b0 = data[i]
        if b0 < 0x80:
            out.append(chr(b0))
            i += 1
            continue
        need = 0 if not b0 & 0x40 else 1 if not b0 & 0x20 else 2 if not b0 & 0x10 else \
            3 if not b0 & 0x08 else 0
        if need and i + need < n and all(data[i + k] & 0xC0 == 0x80
                                            for k in range(1, need + 1)):
            cpt = b0 & (0x3F >> need)
            for k in range(1, need + 1):
                cpt = (cpt << 6) | (data[i + k] & 0x3F)
            if cpt > 0x10FFFF:
                raise InvalidValueError(
                    f"bytes {data[i:i + need + 1]!r} at offset {i} decode to codepoint "
                    f"{cpt:#x}, beyond Unicode; llama.cpp cannot tokenize them either")
            out.append(chr(cpt))
            i += need + 1
        else:
            out.append("\ufffd")
            i += 1
    return "".join(out)


def decode_utf8(data: bytes) -> str:
    """Decode ``data`` to codepoints the way llama.cpp's ``unicode_cpts_from_utf8`` does."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return _decode_slow(data)


def encode_utf8(text: str) -> bytes:
    """UTF-8 of ``text``, lone surrogates included (llama.cpp encodes them as 3 bytes)."""
    return text.encode("utf-8", "surrogatepass")
