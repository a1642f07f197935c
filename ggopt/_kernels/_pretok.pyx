"""The BPE pre-tokenizers of the GPT-2, Llama-3 and Qwen2 families, scanned in C.

They cut text as these regexes do (the ``regex`` package runs them too, 5-10x slower):

- GPT2: ``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``
- LLAMA3 (``NUM_MAX = 3``) and QWEN2 (``NUM_MAX = 1``):
  ``(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|
  \\p{N}{1,NUM_MAX}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+``

``digits_first`` runs llama.cpp's ``\\p{N}`` step before (each number character a piece of its
own, the pattern only inside the runs between them: smollm, starcoder, ...). ``table`` holds
llama.cpp's class of every codepoint (bit 0 letter, bit 1 number, bit 2 whitespace). Each run
is scanned alone: a lookahead does not see past its end. Single-threaded.
"""

from cpython.bytes cimport PyBytes_AS_STRING
from libc.stdint cimport uint8_t, uint32_t

cdef enum:
    LETTER = 1
    NUMBER = 2
    SPACE = 4
    GPT2 = 0
    LLAMA3 = 1
    QWEN2 = 2


cdef inline uint8_t _cls(const uint32_t *cp, const uint8_t *table, Py_ssize_t pos,
                         Py_ssize_t end) noexcept nogil:
    # 0x80 marks "past the run" (llama.cpp's empty flags), never a class bit
    return table[cp[pos]] if pos < end else 0x80


cdef inline uint32_t _lower(uint32_t c) noexcept nogil:
    return c + 32 if 65 <= c <= 90 else c


cdef inline Py_ssize_t _contraction(const uint32_t *cp, Py_ssize_t pos, Py_ssize_t end,
                                    bint fold) noexcept nogil:
    """Length of ``'s|'t|'re|'ve|'m|'ll|'d`` at pos (0: none)."""
    cdef uint32_t a, b
    if cp[pos] != 39 or pos + 1 >= end:
        return 0
    a = _lower(cp[pos + 1]) if fold else cp[pos + 1]
    if a == 115 or a == 116 or a == 109 or a == 100:  # s t m d
        return 2
    if pos + 2 < end:
        b = _lower(cp[pos + 2]) if fold else cp[pos + 2]
        if (a == 114 and b == 101) or (a == 118 and b == 101) or (a == 108 and b == 108):
            return 3
    return 0


cdef Py_ssize_t _scan_gpt2(const uint32_t *cp, const uint8_t *t, Py_ssize_t pos,
                           Py_ssize_t end) noexcept nogil:
    """End of the word that starts at pos."""
    cdef Py_ssize_t n = _contraction(cp, pos, end, False)
    cdef uint8_t f2, bit
    cdef bint sp = cp[pos] == 32
    if n:
        return pos + n
    f2 = _cls(cp, t, pos + 1, end) if sp else t[cp[pos]]
    if f2 & 0x80 == 0:
        if f2 & (LETTER | NUMBER):
            bit = LETTER if f2 & LETTER else NUMBER
            n = pos + sp
            while n < end and t[cp[n]] & bit:
                n += 1
            return n
        if not f2 & SPACE:
            n = pos + sp
            while n < end and not t[cp[n]] & (LETTER | NUMBER | SPACE):
                n += 1
            return n
    n = 0
    while pos + n < end and t[cp[pos + n]] & SPACE:
        n += 1
    if n > 1 and pos + n < end:
        return pos + n - 1
    return pos + (n if n else 1)


cdef Py_ssize_t _scan_llama3(const uint32_t *cp, const uint8_t *t, Py_ssize_t pos,
                             Py_ssize_t end, Py_ssize_t num_max) noexcept nogil:
    cdef Py_ssize_t n = _contraction(cp, pos, end, True)
    cdef uint32_t c = cp[pos]
    cdef uint8_t f = t[c], f2
    cdef Py_ssize_t last_rn = -1
    if n:
        return pos + n
    if not (c == 13 or c == 10 or f & NUMBER):
        if f & LETTER or _cls(cp, t, pos + 1, end) & LETTER:
            n = pos + 1
            while n < end and t[cp[n]] & LETTER:
                n += 1
            return n
    if f & NUMBER:
        n = pos
        while n < end and t[cp[n]] & NUMBER and n - pos < num_max:
            n += 1
        return n
    f2 = _cls(cp, t, pos + 1, end) if c == 32 else f
    if not f2 & (LETTER | NUMBER | SPACE):  # also a space at the end of the run
        n = pos + (c == 32)
        while n < end and not t[cp[n]] & (LETTER | NUMBER | SPACE):
            n += 1
        while n < end and (cp[n] == 13 or cp[n] == 10):
            n += 1
        return n
    n = 0
    while pos + n < end and t[cp[pos + n]] & SPACE:
        if cp[pos + n] == 13 or cp[pos + n] == 10:
            last_rn = pos + n + 1
        n += 1
    if last_rn >= 0:
        return last_rn
    if n > 1 and pos + n < end:
        return pos + n - 1
    return pos + (n if n else 1)


def split(str text, const uint8_t[::1] table, int kind, bint digits_first):
    """The words of ``text`` (see the module docstring)."""
    if table.shape[0] < 0x110000:
        raise ValueError("table: expected one entry per codepoint")
    cdef bytes buf = text.encode("utf-32-le", "surrogatepass")
    cdef const uint32_t *cp = <const uint32_t *> PyBytes_AS_STRING(buf)
    cdef const uint8_t *t = &table[0]
    cdef Py_ssize_t n = len(text), pos = 0, run_end, stop
    cdef Py_ssize_t num_max = 3 if kind == LLAMA3 else 1
    cdef list out = []
    while pos < n:
        run_end = n
        if digits_first:
            if t[cp[pos]] & NUMBER:
                out.append(text[pos:pos + 1])
                pos += 1
                continue
            run_end = pos
            while run_end < n and not t[cp[run_end]] & NUMBER:
                run_end += 1
        while pos < run_end:
            if kind == GPT2:
                stop = _scan_gpt2(cp, t, pos, run_end)
            else:
                stop = _scan_llama3(cp, t, pos, run_end, num_max)
            out.append(text[pos:stop])
            pos = stop
    return out
