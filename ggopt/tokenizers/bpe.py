"""GPT-2 byte-level BPE as llama.cpp runs it (``llm_tokenizer_bpe_session``).

Each word of the pre-tokenizer is UTF-8 encoded and every byte mapped to GPT-2's printable
stand-in character; adjacent symbols are merged lowest merge rank first, ties leftmost, until
no pair of neighbours has a rank. A symbol that is no token falls back to its single bytes
(those that are tokens). Words repeat, so each word's ids are cached.
"""

from __future__ import annotations

import heapq

from ggopt.errors import InvalidValueError
from ggopt.tokenizers.pretokenize import PreTokenizer
from ggopt.tokenizers.unicode import encode_utf8

__all__ = ["BYTE_TO_CHAR", "CHAR_TO_BYTE", "BpeModel"]


def _byte_to_char() -> list[str]:
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


#: GPT-2's map of each byte to the character that stands for it in token texts.
BYTE_TO_CHAR: list[str] = _byte_to_char()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
_LATIN1_TO_BPE = {b: c for b, c in enumerate(BYTE_TO_CHAR)}


class BpeModel:
    """Merges of one vocabulary; ``encode(text)`` gives the ids of a text fragment."""

    def __init__(self, token_to_id: dict[str, int], merges: list[str],
                 pre: PreTokenizer, *, key: str = "tokenizer.ggml.merges") -> None:
        self._vocab = token_to_id
        self._pre = pre
        cuts = [m.find(" ", 1) for m in merges]
        if cuts and min(cuts) < 0:
            rank = cuts.index(-1)
            raise InvalidValueError(f"{key}[{rank}]: expected two tokens separated by a "
                                    f"space, got {merges[rank]!r}")
        pairs = [(m[:c], m[c + 1:]) for m, c in zip(merges, cuts)]
        if {name for pair in pairs for name in pair} - token_to_id.keys():
            rank, missing = next((r, name) for r, pair in enumerate(pairs) for name in pair
                                 if name not in token_to_id)
            raise InvalidValueError(f"{key}[{rank}]: {merges[rank]!r} names {missing!r}, "
                                    f"which is not in tokenizer.ggml.tokens")
        # the first of repeated merges keeps its rank (llama.cpp's map.emplace)
        ranks = dict(zip(reversed(pairs), range(len(pairs) - 1, -1, -1)))
        self._ranks = ranks
        self._cache: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` (codepoints as llama.cpp decoded them): pre-tokenize, then merge."""
        cache = self._cache
        out: list[int] = []
        for word in self._pre.split(text):
            ids = cache.get(word)
            if ids is None:
                ids = self._word(word)
                if len(cache) < 1_000_000:
                    cache[word] = ids
            out += ids
        return out

    def _word(self, word: str) -> list[int]:
        chars = encode_utf8(word).decode("latin-1").translate(_LATIN1_TO_BPE)
        vocab = self._vocab
        if self._pre.ignore_merges and chars in vocab:
            return [vocab[chars]]
        syms = list(chars)
        n = len(syms)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        ranks = self._ranks
        heap: list[tuple[int, int, int, str]] = []
        for i in range(n - 1):
            rank = ranks.get((syms[i], syms[i + 1]))
            if rank is not None:
                heap.append((rank, i, i + 1, syms[i] + syms[i + 1]))
        heapq.heapify(heap)
        while heap:
            _, left, right, text = heapq.heappop(heap)
            a, b = syms[left], syms[right]
            if not a or not b or a + b != text:
                continue
            syms[left] = text
            syms[right] = ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
            before = prv[left]
            if before >= 0:
                rank = ranks.get((syms[before], text))
                if rank is not None:
                    heapq.heappush(heap, (rank, before, left, syms[before] + text))
            if after >= 0:
                rank = ranks.get((text, syms[after]))
                if rank is not None:
                    heapq.heappush(heap, (rank, left, after, text + syms[after]))
        out: list[int] = []
        for sym in syms:
            if not sym:
                continue
            tid = vocab.get(sym)
            if tid is not None:
                out.append(tid)
                continue
            for byte in encode_utf8(sym):  # llama.cpp looks each byte up as a 1-byte token
                tid = vocab.get(bytes([byte]).decode("utf-8", "surrogateescape"))
                if tid is not None:
                    out.append(tid)
        return out
