"""UTF-8 and codepoint classes exactly as llama.cpp's tokenizers see them.

llama.cpp decodes text byte by byte: a byte that does not start a complete sequence becomes
U+FFFD and only that byte is consumed; it does not reject overlong forms or surrogates. The
codepoint classes (``\\p{L}``, ``\\p{N}``, ``\\s``, ...) come from llama.cpp's own table
(:mod:`ggopt.tokenizers._unicode_ranges`), written out as explicit ranges for the ``regex``
package so that its Unicode version does not matter.
"""

from __future__ import annotations

from ggopt.errors import InvalidValueError
from ggopt.tokenizers import _unicode_ranges as _r

__all__ = ["decode_utf8", "encode_utf8", "CLASSES", "utf8_len"]


def _class_body(ranges: tuple[tuple[int, int], ...]) -> str:
    return "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)


#: Bodies of regex character classes (no brackets) keyed by llama.cpp's name for them.
CLASSES: dict[str, str] = {
    "L": _class_body(_r.LETTER),
    "N": _class_body(_r.NUMBER),
    "P": _class_body(_r.PUNCTUATION),
    "S": _class_body(_r.SYMBOL),
    "M": _class_body(_r.ACCENT_MARK),
    "s": _class_body(_r.WHITESPACE),
}

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
