"""llama.cpp's ``rwkv`` vocabulary: escaped byte strings, matched greedily, longest first.

ggopt's own byte-level models use it with the 256 tokens ``\\x00`` ... ``\\xff``, so every
byte is its own id.
"""

from __future__ import annotations

from ggopt.errors import InvalidValueError

__all__ = ["RwkvModel", "unescape"]

_ESCAPES = {ord("t"): 9, ord("n"): 10, ord("r"): 13}


def unescape(text: bytes) -> bytes:
    """A token's bytes from its escaped text (llama.cpp's ``llama_unescape_rwkv_token``)."""
    out = bytearray()
    i = 0
    while i < len(text):
        c = text[i]
        if c == 0x5C and i + 1 < len(text):  # backslash
            e = text[i + 1]
            if e == ord("x"):
                digits = text[i + 2:i + 4]
                acc = 0
                for h in digits:
                    acc = ((acc << 4) + (h - 87 if h >= 97 else h - 48)) & 0xFF
                if len(digits) == 2:  # a cut-off code writes nothing
                    out.append(acc)
                i += 4
                continue
            out.append(_ESCAPES.get(e, e))
            i += 2
            continue
        if c != 0x5C:
            out.append(c)
        i += 1
    return bytes(out)


class RwkvModel:
    """Greedy longest-match tokenization over the unescaped token bytes (at each position,
    one lookup per distinct token length)."""

    def __init__(self, tokens: list[bytes]) -> None:
        self.pieces = [unescape(t) for t in tokens]
        self._ids: dict[bytes, int] = {}
        for tid, piece in enumerate(self.pieces):
            self._ids[piece] = tid  # a later duplicate wins, as in llama.cpp's trie
        self._max_len = max((len(p) for p in self.pieces), default=0)
        # the lengths some token has, longest first: only these can match (a 4,000-byte
        # token among single bytes: 2 lookups per position, not 4,000)
        self._lengths = sorted({len(p) for p in self.pieces if p}, reverse=True)
        self._byte_ids = [self._ids.get(bytes([b])) for b in range(256)]
        self._all_single = self._max_len == 1

    def encode(self, data: bytes) -> list[int]:
        if self._all_single and None not in self._byte_ids:
            table = self._byte_ids
            return [table[b] for b in data]  # type: ignore[misc]
        out: list[int] = []
        i, n, ids = 0, len(data), self._ids
        while i < n:
            for length in self._lengths:
                if length > n - i:
                    continue
                tid = ids.get(data[i:i + length])
                if tid is not None:
                    out.append(tid)
                    i += length
                    break
            else:
                raise InvalidValueError(f"byte {data[i]:#04x} at offset {i}: no rwkv token "
                                        "starts with it (llama.cpp would emit no valid id)")
        return out
