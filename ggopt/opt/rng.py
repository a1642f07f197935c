"""Bit-exact ``std::mt19937`` and the libstdc++ (GCC 12) algorithms ggml draws from it.

ggml shuffles datasets with ``std::shuffle(first, last, rng)`` where ``rng`` is a
default-seeded ``std::mt19937``. :class:`Mt19937` reproduces the engine with NumPy's MT19937
bit generator under legacy (``init_genrand``) seeding, and its methods reproduce
``std::uniform_int_distribution``, ``std::shuffle`` and ``std::normal_distribution<float>``
as libstdc++ implements them, so permutations match ggml exactly.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import DTypeError, InvalidValueError, ShapeError

__all__ = ["Mt19937", "DEFAULT_SEED"]

DEFAULT_SEED = 5489
_U32 = 1 << 32
_BLOCK = 624


class Mt19937:
    """32-bit Mersenne Twister seeded like ``std::mt19937(seed)``.

    Parameters
    ----------
    seed : int
        In ``[0, 2**32)``; ``5489`` is the C++ default.
    """

    def __init__(self, seed: int = DEFAULT_SEED) -> None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise DTypeError(f"mt19937 seed must be an int, got {type(seed).__name__}")
        if not 0 <= seed < _U32:
            raise InvalidValueError(f"mt19937 seed must be in [0, 2**32), got {seed}")
        legacy = np.random.RandomState(int(seed)).get_state(legacy=False)
        self._bitgen = np.random.MT19937()
        self._bitgen.state = {"bit_generator": "MT19937", "state": legacy["state"]}
        self._buf: list[int] = []
        self._pos = 0

    def __call__(self) -> int:
        """Return the next 32-bit output (``rng()``)."""
        if self._pos == len(self._buf):
            self._buf = self._bitgen.random_raw(_BLOCK).astype(np.uint32).tolist()
            self._pos = 0
        x = self._buf[self._pos]
        self._pos += 1
        return x

    def get_state(self) -> np.ndarray:
        """The engine's exact position as uint32 words, for checkpoints.

        Layout: ``[pos, nbuffered, key[0..623], buffered outputs...]``, where ``key``/``pos``
        are the twister's state and the buffered outputs were drawn from it but not yet used.
        """
        st = self._bitgen.state["state"]
        rest = self._buf[self._pos:]
        head = np.array([st["pos"], len(rest)], dtype=np.uint32)
        return np.concatenate([head, st["key"].astype(np.uint32), np.array(rest, np.uint32)])

    def set_state(self, state: np.ndarray) -> None:
        """Restore a position from :meth:`get_state`; checks everything before changing anything.

        Raises
        ------
        ShapeError
            ``state`` is not a 1-D array of that layout.
        """
        words = np.asarray(state)
        if words.ndim != 1 or words.dtype != np.uint32 or len(words) < 2 + _BLOCK:
            raise ShapeError(
                f"mt19937 state: expected 1-D uint32 [pos, nbuffered, 624 key words, buffered], "
                f"got {words.dtype} shape {words.shape}"
            )
        pos, nbuf = int(words[0]), int(words[1])
        if pos > _BLOCK or nbuf > _BLOCK or len(words) != 2 + _BLOCK + nbuf:
            raise ShapeError(
                f"mt19937 state: expected pos <= {_BLOCK} and {2 + _BLOCK} + nbuffered words "
                f"with nbuffered <= {_BLOCK}, got pos={pos}, nbuffered={nbuf}, {len(words)} words"
            )
        key = words[2:2 + _BLOCK]
        if not (key[0] & 0x80000000) and not key[1:].any():
            raise ShapeError(  # the 19937 bits of state are all zero: the generator would
                "mt19937 state: all 19937 state bits are zero, which is not a valid state "
                "(the generator would only ever return 0)")  # return 0 forever
        bitgen = np.random.MT19937()
        bitgen.state = {"bit_generator": "MT19937",
                        "state": {"key": words[2:2 + _BLOCK].copy(), "pos": pos}}
        self._bitgen = bitgen
        self._buf = words[2 + _BLOCK:].tolist()
        self._pos = 0

    def uniform_int(self, lo: int, hi: int) -> int:
        """Draw from ``std::uniform_int_distribution(lo, hi)`` (Lemire's method, 32 bits)."""
        if hi < lo or hi - lo >= _U32:
            raise ShapeError(f"uniform_int needs 0 <= hi - lo < 2**32, got lo={lo}, hi={hi}")
        span = hi - lo + 1
        if span == _U32:
            return lo + self()
        product = self() * span
        low = product & (_U32 - 1)
        if low < span:
            threshold = (_U32 - span) % span
            while low < threshold:
                product = self() * span
                low = product & (_U32 - 1)
        return lo + (product >> 32)

    def shuffle(self, v: np.ndarray) -> None:
        """Shuffle the 1-D array ``v`` in place like libstdc++'s ``std::shuffle(v, rng)``."""
        n = len(v)
        if n == 0:
            return
        a = v.tolist()
        if (_U32 - 1) // n < n:
            for i in range(1, n):
                j = self.uniform_int(0, i)
                a[i], a[j] = a[j], a[i]
        else:
            i = 1
            if n % 2 == 0:
                j = self.uniform_int(0, 1)
                a[1], a[j] = a[j], a[1]
                i = 2
            while i < n:
                r = i + 1
                x = self.uniform_int(0, r * (r + 1) - 1)
                j = x // (r + 1)
                a[i], a[j] = a[j], a[i]
                j = x % (r + 1)
                a[i + 1], a[j] = a[j], a[i + 1]
                i += 2
        v[:] = a

    def canonical_f32(self) -> np.float32:
        """Draw ``std::generate_canonical<float, 24>``: a float32 in ``[0, 1)``."""
        u: np.float32 = np.float32(self()) / np.float32(_U32)
        if u >= 1:
            u = np.nextafter(np.float32(1), np.float32(0))
        return u

    def normal_f32(self, n: int, mean: float = 0.0, sd: float = 1.0) -> np.ndarray:
        """Draw ``n`` values of a fresh ``std::normal_distribution<float>(mean, sd)``.

        Marsaglia's polar method in float32; each pair of draws is returned second value
        first, as libstdc++ caches the other one.
        """
        mean32, sd32 = np.float32(mean), np.float32(sd)
        one, two = np.float32(1), np.float32(2)
        out = np.empty(n, dtype=np.float32)
        cached = None
        for k in range(n):
            if cached is not None:
                z, cached = cached, None
            else:
                while True:
                    x = two * self.canonical_f32() - one
                    y = two * self.canonical_f32() - one
                    s = x * x + y * y
                    if 0 < s <= 1:
                        break
                mult = np.sqrt(np.float32(-2) * np.float32(math.log(float(s))) / s)
                cached = x * mult
                z = y * mult
            out[k] = z * sd32 + mean32
        return out
