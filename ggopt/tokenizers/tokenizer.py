"""The tokenizer of a GGUF file: ``encode`` and ``decode`` as llama.cpp's ``llama_tokenize``
and ``llama_token_to_piece``."""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ggopt.errors import DTypeError, InvalidValueError, ShapeError
from ggopt.tokenizers.bpe import CHAR_TO_BYTE, BpeModel
from ggopt.tokenizers.pretokenize import pre_tokenizer
from ggopt.tokenizers.rwkv import RwkvModel
from ggopt.tokenizers.special import Attr
from ggopt.tokenizers.spm import SPACE, SpmModel
from ggopt.tokenizers.unicode import decode_utf8, encode_utf8
from ggopt.tokenizers.vocab import Vocab

if TYPE_CHECKING:
    from ggopt.tokenizers.chat import TemplateLimits

__all__ = ["Tokenizer"]

_ISSPACE = frozenset(b" \t\n\v\f\r")
_SPACES = re.compile(rb"[ \t\n\v\f\r]*")
_SPACE_BYTES = SPACE.encode()


def _bpe_piece(text: str) -> bytes:
    out = bytearray()
    for ch in text:  # llama_decode_text: characters outside GPT-2's byte map are kept marked
        b = CHAR_TO_BYTE.get(ch)
        if b is None:
            utf8 = encode_utf8(ch)
            out += b"[UNK_BYTE_0x" + utf8.hex().encode() + encode_utf8(text) + b"]"
        else:
            out.append(b)
    return bytes(out)


class Tokenizer:
    """llama.cpp's tokenizer for one vocabulary (build it with :func:`ggopt.tokenizers.load`).

    ``encode(text, add_special=True, parse_special=False)`` follows ``llama_tokenize``: BOS and
    EOS as the vocabulary says when ``add_special``; control and unknown tokens written in the
    text become their ids only with ``parse_special``; user-defined tokens always do.
    ``decode(ids)`` concatenates ``llama_token_to_piece`` of each id (bytes, since a piece may
    be part of a UTF-8 character).
    """

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.model = vocab.model
        self.pre = vocab.pre
        texts = vocab.texts
        self._rwkv: RwkvModel | None = None
        self._spm: SpmModel | None = None
        self._bpe: BpeModel | None = None
        if vocab.model == "rwkv":
            self._rwkv = RwkvModel(vocab.tokens)
        elif vocab.model == "llama":
            scores = vocab.scores or [0.0] * len(vocab.tokens)
            self._spm = SpmModel({t: i for i, t in enumerate(vocab.tokens)}, scores)
        else:
            assert vocab.merges is not None
            self._bpe = BpeModel({t: i for i, t in enumerate(texts)}, vocab.merges,
                                 pre_tokenizer(vocab.pre))
        self._pieces: list[bytes | None] = [None] * len(vocab.tokens)  # filled on first use
        self.source = ""  # the file it was read from (named in template errors)

    def clear_cache(self) -> None:
        """Forget the per-word cache of the BPE/SPM model (encoding is then a first pass)."""
        for model in (self._bpe, self._spm):
            if model is not None:
                model.clear_cache()

    # -- properties ---------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return len(self.vocab.tokens)

    @property
    def bos(self) -> int | None:
        return self.vocab.ids["bos"]

    @property
    def eos(self) -> int | None:
        return self.vocab.ids["eos"]

    @property
    def eot(self) -> int | None:
        return self.vocab.ids["eot"]

    @property
    def eog(self) -> frozenset[int]:
        """Ids that end generation (llama.cpp's ``llama_vocab_is_eog``)."""
        return self.vocab.eog

    @property
    def add_bos(self) -> bool:
        return self.vocab.add_bos

    @property
    def add_eos(self) -> bool:
        return self.vocab.add_eos

    @property
    def token_type(self) -> list[int]:
        """``tokenizer.ggml.token_type`` per id (1 normal, 2 unknown, 3 control, ...)."""
        return list(self.vocab.types)

    @property
    def chat_template(self) -> str | None:
        return self.vocab.chat_template

    @property
    def special_texts(self) -> tuple[str, str]:
        """The texts of BOS and EOS (``""`` where the vocabulary has none), as a chat template
        sees them (``bos_token``, ``eos_token``)."""
        texts = self.vocab.texts
        return (texts[self.bos] if self.bos is not None else "",
                texts[self.eos] if self.eos is not None else "")

    def with_chat_template(self, template: str) -> Tokenizer:
        """This tokenizer with ``template`` as its chat template instead of the file's (the
        vocabulary and its caches shared; ``template`` from
        :func:`ggopt.tokenizers.templates.resolve_template`)."""
        tok = copy.copy(self)
        tok.vocab = dataclasses.replace(self.vocab, chat_template=template)
        return tok

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *,
                            add_generation_prompt: bool = False, template: str | None = None,
                            limits: TemplateLimits | None = None, **variables: Any) -> str:
        """Render the vocabulary's ``tokenizer.chat_template`` (or ``template``) for
        ``messages``, with this vocabulary's BOS/EOS texts, under ``limits`` (see
        :mod:`.chat`; errors name :attr:`source`)."""
        from ggopt.tokenizers.chat import DEFAULT_LIMITS, render_chat

        template = template if template is not None else self.chat_template
        if template is None:
            raise InvalidValueError("tokenizer.chat_template: the file has none (pass "
                                    "template=...)")
        bos, eos = self.special_texts
        return render_chat(template, messages, add_generation_prompt=add_generation_prompt,
                           bos_token=bos, eos_token=eos, limits=limits or DEFAULT_LIMITS,
                           source=self.source, **variables)

    def token_text(self, tid: int) -> bytes:
        """The token's text as stored in the vocabulary."""
        return self.vocab.tokens[self._check_id(tid)]

    def is_eog(self, tid: int) -> bool:
        return tid in self.vocab.eog

    def __repr__(self) -> str:
        return (f"Tokenizer(model={self.model!r}, pre={self.pre!r}, n_vocab={self.n_vocab}, "
                f"bos={self.bos}, eos={self.eos})")

    # -- encode -------------------------------------------------------------------------------
    def encode(self, text: str | bytes, *, add_special: bool = True,
               parse_special: bool = False) -> list[int]:
        """Token ids of ``text`` (a str is UTF-8 encoded first), as ``llama_tokenize``."""
        if isinstance(text, str):
            data = encode_utf8(text)
        elif isinstance(text, (bytes, bytearray, memoryview)):
            data = bytes(text)
        else:
            raise DTypeError(f"encode: expected str or bytes, got {type(text).__name__}")
        v = self.vocab
        fragments: list[bytes | int] = self._partition(data, parse_special) if data else []
        out: list[int] = []
        if add_special and v.add_bos:
            out.append(v.ids["bos"])  # type: ignore[arg-type]
        prev_special = True
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
                continue
            if self._spm is not None:
                piece = (b" " + frag) if v.add_space_prefix and prev_special else frag
                out += self._spm.encode(piece.replace(b" ", _SPACE_BYTES))
            elif self._bpe is not None:
                out += self._bpe.encode(decode_utf8(frag))
            else:
                assert self._rwkv is not None
                out += self._rwkv.encode(frag)
            prev_special = False
        if add_special and v.add_eos:
            out.append(v.ids["eos"])  # type: ignore[arg-type]
        return out

    def _partition(self, data: bytes, parse_special: bool) -> list[bytes | int]:
        """Cut out special tokens, longest first (llama.cpp's ``tokenizer_st_partition``)."""
        frags: list[bytes | int] = [data]
        v = self.vocab
        for tid in v.special_order:
            attr = v.attrs[tid]
            if not parse_special and attr & (Attr.CONTROL | Attr.UNKNOWN):
                continue
            text = v.tokens[tid]
            if text not in data:  # every fragment is a part of the text: one scan
                continue
            new: list[bytes | int] = []
            for frag in frags:
                if isinstance(frag, int) or text not in frag:
                    new.append(frag)
                    continue
                start = 0  # indices, never copies of the rest: linear in the text
                while True:
                    pos = frag.find(text, start)
                    if pos < 0:
                        if start < len(frag):
                            new.append(frag[start:])
                        break
                    left = frag[start:pos]
                    if attr & Attr.LSTRIP:
                        left = left.rstrip(b" \t\n\v\f\r")
                    if left:
                        new.append(left)
                    new.append(tid)
                    start = pos + len(text)
                    if attr & Attr.RSTRIP:
                        start = _SPACES.match(frag, start).end()  # type: ignore[union-attr]
            frags = new
        return frags

    # -- decode -------------------------------------------------------------------------------
    def _piece(self, tid: int) -> bytes:
        v = self.vocab
        attr, text = v.attrs[tid], v.tokens[tid]
        if self._rwkv is not None:
            return self._rwkv.pieces[tid]
        if attr & (Attr.UNKNOWN | Attr.CONTROL | Attr.USER_DEFINED):
            return text
        if attr & Attr.NORMAL:
            if self._spm is not None:
                return text.replace(_SPACE_BYTES, b" ")
            return _bpe_piece(text.decode("utf-8", "surrogateescape"))
        if attr & Attr.BYTE:
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                raise InvalidValueError(f"tokenizer.ggml.tokens[{tid}]: byte token {text!r} "
                                        "is not <0xNN>") from None
        return b""

    def _check_id(self, tid: object) -> int:
        if isinstance(tid, bool) or not hasattr(tid, "__index__"):
            raise DTypeError(f"token id: expected an int, got {type(tid).__name__}")
        try:
            i = tid.__index__()
        except TypeError:  # a NumPy array of more than one element, ...
            raise DTypeError(f"token id: expected an int, got {type(tid).__name__} "
                             f"{getattr(tid, 'shape', '')}") from None
        if not 0 <= i < len(self._pieces):
            raise InvalidValueError(f"token id {i}: expected 0 <= id < {len(self._pieces)}")
        return int(i)

    def piece(self, tid: int, *, special: bool = True) -> bytes:
        """``llama_token_to_piece(tid, special)``: control/unknown tokens are empty unless
        ``special``."""
        i = self._check_id(tid)
        if not special and self.vocab.attrs[i] & (Attr.UNKNOWN | Attr.CONTROL):
            return b""
        piece = self._pieces[i]
        if piece is None:
            piece = self._pieces[i] = self._piece(i)
        return piece

    def decode(self, ids: Iterable[int] | Sequence[int], *, special: bool = True) -> bytes:
        """The bytes of ``ids`` (a sequence of ids, or a 1-D integer array): each token's piece
        (``llama_token_to_piece``), joined."""
        shape = getattr(ids, "shape", None)
        if shape is not None and len(shape) != 1:
            raise ShapeError(f"decode: expected a sequence of token ids (1-D), got an array "
                             f"of shape {tuple(shape)} (decode each row)")
        return b"".join([self.piece(t, special=special) for t in ids])
