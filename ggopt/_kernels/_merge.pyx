"""The merge loops of the BPE and SentencePiece tokenizers (``ggopt.tokenizers``), in C.

Both merge adjacent symbols in priority order until no pair qualifies: BPE the pair of lowest
merge rank, SentencePiece the pair whose concatenation is the token of highest score; ties go
to the leftmost pair. A queued pair is stale once either symbol changed, which shows in their
lengths (a symbol only grows, or is emptied into its left neighbour). Single-threaded; the
pure-Python versions in ``ggopt.tokenizers.bpe`` / ``.spm`` are the reference.
"""

from cpython.bytes cimport PyBytes_AS_STRING
from libc.stdlib cimport free, malloc, realloc

from ggopt.errors import OutOfMemoryError


cdef struct Pair:
    double key        # rank, or minus the score: smaller first
    Py_ssize_t left
    Py_ssize_t right
    Py_ssize_t n_left
    Py_ssize_t n_right


cdef struct Heap:
    Pair *items
    Py_ssize_t size
    Py_ssize_t cap


cdef inline bint _before(Pair *a, Pair *b) noexcept nogil:
    return a.key < b.key or (a.key == b.key and a.left < b.left)


cdef int _push(Heap *h, Pair p) except -1:
    cdef Pair *grown
    cdef Py_ssize_t i, parent
    if h.size == h.cap:
        h.cap = h.cap * 2 + 16
        grown = <Pair *> realloc(h.items, h.cap * sizeof(Pair))
        if grown == NULL:
            raise OutOfMemoryError("tokenizer merge queue")
        h.items = grown
    i = h.size
    h.size += 1
    while i > 0:
        parent = (i - 1) // 2
        if not _before(&p, &h.items[parent]):
            break
        h.items[i] = h.items[parent]
        i = parent
    h.items[i] = p
    return 0


cdef Pair _pop(Heap *h) noexcept nogil:
    cdef Pair top = h.items[0], last
    cdef Py_ssize_t i = 0, child
    h.size -= 1
    last = h.items[h.size]
    while True:
        child = 2 * i + 1
        if child >= h.size:
            break
        if child + 1 < h.size and _before(&h.items[child + 1], &h.items[child]):
            child += 1
        if not _before(&h.items[child], &last):
            break
        h.items[i] = h.items[child]
        i = child
    if h.size:
        h.items[i] = last
    return top


cdef class _Symbols:
    """Start, length and neighbours of each symbol, and the queue of candidate pairs."""
    cdef Py_ssize_t *start
    cdef Py_ssize_t *n
    cdef Py_ssize_t *prv
    cdef Py_ssize_t *nxt
    cdef Py_ssize_t count
    cdef Heap heap

    def __cinit__(self, Py_ssize_t count):
        self.count = count
        self.start = <Py_ssize_t *> malloc((count + 1) * 4 * sizeof(Py_ssize_t))
        if self.start == NULL:
            raise OutOfMemoryError("tokenizer symbols")
        self.n = self.start + count + 1
        self.prv = self.n + count + 1
        self.nxt = self.prv + count + 1
        self.heap.items = NULL
        self.heap.size = 0
        self.heap.cap = 0

    def __dealloc__(self):
        free(self.start)
        free(self.heap.items)

    cdef void link(self) noexcept:
        cdef Py_ssize_t i
        for i in range(self.count):
            self.prv[i] = i - 1
            self.nxt[i] = i + 1 if i + 1 < self.count else -1

    cdef Py_ssize_t merge_next(self) noexcept:
        """Pop until a live pair; merge it and return its left symbol (-1: queue empty)."""
        cdef Pair p
        cdef Py_ssize_t after
        while self.heap.size:
            p = _pop(&self.heap)
            if (self.n[p.left] != p.n_left or self.n[p.right] != p.n_right
                    or not p.n_left or not p.n_right):
                continue
            self.n[p.left] += p.n_right
            self.n[p.right] = 0
            after = self.nxt[p.right]
            self.nxt[p.left] = after
            if after >= 0:
                self.prv[after] = p.left
            return p.left
        return -1


def bpe_merge(str word, dict ranks, dict vocab):
    """Symbols of ``word`` (one per character) merged by ``ranks`` ((left, right) -> rank);
    returns each final symbol's id in ``vocab``, or the symbol's text when it is no token."""
    cdef Py_ssize_t count = len(word), i, left, other
    cdef _Symbols s = _Symbols(count)
    cdef object rank, tid
    cdef Pair p
    cdef list out = []
    s.link()
    for i in range(count):
        s.start[i] = i
        s.n[i] = 1
    for i in range(count - 1):
        rank = ranks.get((word[i], word[i + 1]))
        if rank is not None:
            p.key, p.left, p.right, p.n_left, p.n_right = <double> rank, i, i + 1, 1, 1
            _push(&s.heap, p)
    while True:
        left = s.merge_next()
        if left < 0:
            break
        for other in (s.prv[left], s.nxt[left]):
            if other < 0:
                continue
            i, p.right = (other, left) if other < left else (left, other)
            rank = ranks.get((word[s.start[i]:s.start[i] + s.n[i]],
                              word[s.start[p.right]:s.start[p.right] + s.n[p.right]]))
            if rank is not None:
                p.key, p.left, p.n_left, p.n_right = <double> rank, i, s.n[i], s.n[p.right]
                _push(&s.heap, p)
    i = 0 if count else -1
    while i >= 0:
        text = word[s.start[i]:s.start[i] + s.n[i]]
        tid = vocab.get(text)
        out.append(text if tid is None else tid)
        i = s.nxt[i]
    return out


def spm_merge(bytes data, dict vocab, list scores):
    """SentencePiece symbols of ``data`` (one per UTF-8 character by lead byte) merged while
    a neighbouring pair is a token, highest score first; returns each final symbol's id, or
    its bytes when it is no token."""
    cdef const unsigned char *raw = <const unsigned char *> PyBytes_AS_STRING(data)
    cdef Py_ssize_t size = len(data), count = 0, offs = 0, i, left, other, step, a
    cdef _Symbols s
    cdef object tid
    cdef Pair p
    cdef list out = []
    while offs < size:  # count the symbols first
        step = 1 if raw[offs] < 0xC0 else 2 if raw[offs] < 0xE0 else 3 if raw[offs] < 0xF0 else 4
        offs += step
        count += 1
    s = _Symbols(count)
    s.link()
    offs = 0
    for i in range(count):
        step = 1 if raw[offs] < 0xC0 else 2 if raw[offs] < 0xE0 else 3 if raw[offs] < 0xF0 else 4
        s.start[i] = offs
        s.n[i] = min(step, size - offs)
        offs += step
    for i in range(count - 1):
        tid = vocab.get(data[s.start[i]:s.start[i] + s.n[i] + s.n[i + 1]])
        if tid is not None:
            p.key, p.left, p.right = -<double> scores[tid], i, i + 1
            p.n_left, p.n_right = s.n[i], s.n[i + 1]
            _push(&s.heap, p)
    while True:
        left = s.merge_next()
        if left < 0:
            break
        for other in (s.prv[left], s.nxt[left]):
            if other < 0:
                continue
            a, p.right = (other, left) if other < left else (left, other)
            tid = vocab.get(data[s.start[a]:s.start[a] + s.n[a] + s.n[p.right]])
            if tid is not None:
                p.key, p.left = -<double> scores[tid], a
                p.n_left, p.n_right = s.n[a], s.n[p.right]
                _push(&s.heap, p)
    i = 0 if count else -1
    while i >= 0:
        text = data[s.start[i]:s.start[i] + s.n[i]]
        tid = vocab.get(text)
        out.append(text if tid is None else tid)
        i = s.nxt[i]
    return out
