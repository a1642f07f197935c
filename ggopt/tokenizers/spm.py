"""SentencePiece-style tokenization as llama.cpp runs it (``llm_tokenizer_spm_session``).

Spaces become ``▁``; the text is cut into UTF-8 characters (by lead byte, as llama.cpp does,
so invalid bytes stay single symbols); the adjacent pair whose concatenation is the token of
highest score is merged first, ties leftmost, until no pair is a token. A final symbol that is
no token is written as its bytes' ``<0xNN>`` tokens (or the raw byte's token).

llama.cpp's ``resegment`` only ever meets such single characters: a pair is merged only when
its text is a token, so its reverse-merge table never applies.

When no token has a ``▁`` after another character (true of Llama's and Phi-3's vocabularies,
checked at load), no merge can cross the start of a ``▁`` run, so valid UTF-8 text is cut
there into words that are merged separately and cached: the same ids, much faster.
"""

from __future__ import annotations

import heapq

import regex

from ggopt.errors import InvalidValueError
from ggopt.tokenizers.unicode import utf8_len

__all__ = ["SpmModel", "SPACE"]

SPACE = "\u2581"
_SPACE_BYTES = SPACE.encode()
_WORDS = regex.compile(f"{SPACE}*[^{SPACE}]+|{SPACE}+")


class SpmModel:
    """Scores and byte tokens of one vocabulary; ``encode(data)`` gives the ids of bytes."""

    def __init__(self, token_to_id: dict[bytes, int], scores: list[float]) -> None:
        self._vocab = token_to_id
        self._scores = scores
        self._bytes: list[int | None] = []
        for b in range(256):
            tid = token_to_id.get(f"<0x{b:02X}>".encode())
            self._bytes.append(tid if tid is not None else token_to_id.get(bytes([b])))
        self._word_split = not any(_SPACE_BYTES in t.lstrip(_SPACE_BYTES) for t in token_to_id)
        self._cache: dict[bytes, list[int]] = {}

    def encode(self, data: bytes) -> list[int]:
        """Ids of ``data``, spaces already escaped as ``▁``."""
        if not self._word_split:
            return self._merge(data)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return self._merge(data)
        out: list[int] = []
        cache = self._cache
        for word in _WORDS.findall(text):
            raw = word.encode()
            ids = cache.get(raw)
            if ids is None:
                ids = self._merge(raw)
                if len(cache) < 1_000_000:
                    cache[raw] = ids
            out += ids
        return out

    def _merge(self, data: bytes) -> list[int]:
        starts: list[int] = []
        offs = 0
        while offs < len(data):
            starts.append(offs)
            offs += utf8_len(data[offs])
        n = len(starts)
        size = [min(s + utf8_len(data[s]), len(data)) - s for s in starts]
        nxt = list(range(1, n + 1))
        if n:
            nxt[-1] = -1
        prv = list(range(-1, n - 1))
        vocab, scores = self._vocab, self._scores
        heap: list[tuple[float, int, int, int]] = []

        def bigram(left: int, right: int) -> None:
            start = starts[left]
            text = data[start:start + size[left] + size[right]]
            tid = vocab.get(text)
            if tid is not None:
                heapq.heappush(heap, (-scores[tid], left, right, len(text)))

        for i in range(n - 1):
            bigram(i, i + 1)
        while heap:
            _, left, right, length = heapq.heappop(heap)
            if not size[left] or not size[right] or size[left] + size[right] != length:
                continue
            size[left] = length
            size[right] = 0
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
            if prv[left] >= 0:
                bigram(prv[left], left)
            if after >= 0:
                bigram(left, after)
        out: list[int] = []
        i = 0 if n else -1
        while i >= 0:
            text = data[starts[i]:starts[i] + size[i]]
            tid = vocab.get(text)
            if tid is not None:
                out.append(tid)
            else:
                for b in text:
                    byte_id = self._bytes[b]
                    if byte_id is None:
                        raise InvalidValueError(
                            f"byte {b:#04x} of {text!r} is no token and the vocabulary has no "
                            f"<0x{b:02X}> byte token (llama.cpp aborts here)")
                    out.append(byte_id)
            i = nxt[i]
        return out
