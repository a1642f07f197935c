"""Datasets: typed host storage cut into shards, served as batches in permutation order."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import xxhash

from .._kernels._gather import gather_shards
from ..backend import tensor_set
from ..backend.cpu.threads import get_n_threads
from ..context import Context
from ..errors import DTypeError, InvalidValueError, OutOfMemoryError, ShapeError, StateError
from ..tensor import Tensor
from ..types import GGType, as_type
from .checks import check_int
from .rng import Mt19937

__all__ = ["Dataset"]


def _host_bytes(t: Tensor) -> np.ndarray:
    """The memory of a contiguous host tensor as a flat, writeable uint8 array."""
    return t.numpy().reshape(-1).view(np.uint8)



class _HasRng(Protocol):
    """What :meth:`Dataset.shuffle` accepts besides an engine: an owner of one (OptContext)."""

    @property
    def rng(self) -> Mt19937: ...

class Dataset:
    """Datapoints (and optional labels) in host memory, cut into shards of ``ndata_shard``.

    Parameters
    ----------
    type_data, type_label : GGType
        Element types of the data and the labels.
    ne_datapoint : int
        Elements per datapoint (> 0).
    ne_label : int
        Elements per label (>= 0); 0 means an unsupervised dataset without labels.
    ndata : int
        Number of datapoints (> 0).
    ndata_shard : int
        Datapoints per shard (> 0), the unit of shuffling and of batches. Datapoints past the
        last whole shard are never served.

    Notes
    -----
    :attr:`data` has ggml shape ``[ne_datapoint, ndata]`` (NumPy ``(ndata, ne_datapoint)``),
    :attr:`labels` ``[ne_label, ndata]``; fill them through ``dataset.data.numpy()``. A batch is
    the byte concatenation of whole shards in permutation order (torch: a ``DataLoader`` whose
    sampler shuffles blocks of ``ndata_shard`` samples).

    ggml: ``ggml_opt_dataset_init``.
    """

    def __init__(
        self,
        type_data: GGType,
        type_label: GGType,
        ne_datapoint: int,
        ne_label: int,
        ndata: int,
        ndata_shard: int,
    ) -> None:
        fn = "ggml_opt_dataset_init"
        type_data, type_label = as_type(type_data), as_type(type_label)
        ne_datapoint = check_int(ne_datapoint, "ne_datapoint", fn)
        ne_label = check_int(ne_label, "ne_label", fn)
        ndata = check_int(ndata, "ndata", fn)
        ndata_shard = check_int(ndata_shard, "ndata_shard", fn)
        for name, value, ok, bound in (
            ("ne_datapoint", ne_datapoint, ne_datapoint > 0, "> 0"),
            ("ne_label", ne_label, ne_label >= 0, ">= 0"),
            ("ndata", ndata, ndata > 0, "> 0"),
            ("ndata_shard", ndata_shard, ndata_shard > 0, "> 0"),
        ):
            if not ok:
                raise ShapeError(f"{name} must be {bound}, got {value} ({fn})")

        self._ctx = Context(no_alloc=False)
        self._data = self._ctx.new_tensor_2d(type_data, ne_datapoint, ndata)
        self._data.name = "dataset data"
        self._labels = None
        if ne_label > 0:
            self._labels = self._ctx.new_tensor_2d(type_label, ne_label, ndata)
            self._labels.name = "dataset labels"
        self._ndata = ndata
        self._ndata_shard = ndata_shard
        self._nbs_data = self._data.nbytes() * ndata_shard // ndata
        self._nbs_labels = 0 if self._labels is None else (
            self._labels.nbytes() * ndata_shard // ndata
        )
        try:
            self._permutation = np.arange(ndata // ndata_shard, dtype=np.int64)
        except (MemoryError, ValueError) as exc:
            raise OutOfMemoryError(f"no memory for the shard order of {ndata // ndata_shard} "
                                   f"shards ({exc}) ({fn})") from None

    # --- accessors ------------------------------------------------------------------------
    @property
    def ndata(self) -> int:
        """Number of datapoints (ggml: ``ggml_opt_dataset_ndata``)."""
        return self._ndata

    @property
    def data(self) -> Tensor:
        """Data tensor, ggml shape ``[ne_datapoint, ndata]`` (ggml: ``ggml_opt_dataset_data``)."""
        return self._data

    @property
    def labels(self) -> Tensor | None:
        """Labels tensor ``[ne_label, ndata]``, or None without labels (``..._labels``)."""
        return self._labels

    @property
    def ndata_shard(self) -> int:
        """Datapoints per shard."""
        return self._ndata_shard

    @property
    def nshards(self) -> int:
        """Number of whole shards, ``ndata // ndata_shard``."""
        return len(self._permutation)

    @property
    def permutation(self) -> np.ndarray:
        """A copy of the current shard order."""
        perm: np.ndarray = self._permutation.copy()
        return perm

    def set_permutation(self, order: np.ndarray) -> None:
        """Restore a shard order (from :attr:`permutation`, e.g. a checkpoint's); checked
        to be a permutation of ``0..nshards-1`` before anything changes."""
        order = np.asarray(order)
        n = len(self._permutation)
        if order.shape != (n,) or order.dtype.kind not in "iu" or not np.array_equal(
                np.sort(order), np.arange(n)):
            raise ShapeError(f"the shard order must be a permutation of 0..{n - 1}, got "
                             f"{order.dtype} shape {order.shape} (set_permutation)")
        self._permutation[:] = order

    def digest(self) -> str:
        """xxh3-128 (hex) of the data and labels (types, shapes, bytes): what a checkpoint
        records to recognise the dataset it was trained on. The shard order is not in it."""
        h = xxhash.xxh3_128()
        for t in (self._data, self._labels):
            if t is not None:
                h.update(f"{t.type.name}{t.ne}".encode())
                h.update(_host_bytes(t).data)
        return h.hexdigest()

    # --- shuffling ------------------------------------------------------------------------
    def shuffle(self, rng: Mt19937 | _HasRng, idata: int = -1) -> None:
        """Shuffle the shard order with the random engine ``rng``.

        Parameters
        ----------
        rng : Mt19937 or OptContext
            The ``std::mt19937`` to advance, or anything with an ``rng`` attribute holding one:
            ggml passes the optimization context (``OptContext.rng``, seed 5489 unless set in
            :class:`OptParams`).
        idata : int
            Negative: shuffle every shard. Otherwise shuffle only the shards of the first
            ``idata`` datapoints (a multiple of ``ndata_shard``, at most ``ndata``) and keep the
            rest in place.

        ggml: ``ggml_opt_dataset_shuffle``.
        """
        fn = "ggml_opt_dataset_shuffle"
        engine = rng if isinstance(rng, Mt19937) else getattr(rng, "rng", None)
        if not isinstance(engine, Mt19937):
            raise DTypeError(f"rng must be a Mt19937 or an OptContext (which holds one), got "
                             f"{type(rng).__name__} ({fn})")
        idata = check_int(idata, "idata", fn)
        if idata > self._ndata:
            raise ShapeError(f"idata={idata} exceeds ndata={self._ndata} ({fn})")
        if idata < 0:
            engine.shuffle(self._permutation)
            return
        if idata % self._ndata_shard != 0:
            raise ShapeError(
                f"idata={idata} is not a multiple of ndata_shard={self._ndata_shard} ({fn})"
            )
        engine.shuffle(self._permutation[: idata // self._ndata_shard])

    # --- batches --------------------------------------------------------------------------
    def _check_ibatch(self, ibatch: object, shards_per_batch: int, fn: str) -> int:
        ibatch = check_int(ibatch, "ibatch", fn)
        nbatches = self.nshards // shards_per_batch if shards_per_batch else 0
        if ibatch < 0 or (ibatch + 1) * shards_per_batch > self.nshards:
            raise ShapeError(
                f"ibatch={ibatch} out of range: a batch of {shards_per_batch} shards fits "
                f"{nbatches} times into {self.nshards} shards ({fn})"
            )
        return ibatch

    def _check_labels_presence(self, given: bool, fn: str) -> None:
        if given != (self._labels is not None):
            if given:
                raise ShapeError(f"labels batch given but the dataset has no labels ({fn})")
            raise ShapeError(f"the dataset has labels but no labels batch was given ({fn})")

    def _shards_per_batch(self, nbytes: int, fn: str) -> int:
        if nbytes % self._nbs_data != 0:
            raise ShapeError(
                f"data batch of {nbytes} bytes is not a whole number of shards of "
                f"{self._nbs_data} bytes ({self._ndata_shard} datapoints) ({fn})"
            )
        return nbytes // self._nbs_data

    def _check_destinations(self, dsts: list[tuple[str, np.ndarray]], fn: str) -> None:
        """Raise InvalidValueError when a destination shares memory with the dataset's storage
        or with another destination: the copy would overwrite the rows it reads."""
        storages = [("data", self._data), ("labels", self._labels)]
        for i, (name, dst) in enumerate(dsts):
            for what, t in storages:
                if t is not None and np.may_share_memory(dst, _host_bytes(t)):
                    raise InvalidValueError(f"{name} shares memory with the dataset's {what}: "
                                            f"expected a separate array ({fn})")
            for other, odst in dsts[i + 1:]:
                if np.may_share_memory(dst, odst):
                    raise InvalidValueError(f"{name} and {other} share memory; expected "
                                            f"separate arrays ({fn})")

    def _gather(self, src: Tensor | None, dst: np.ndarray, first: int, nshards: int,
                nbs: int) -> None:
        assert src is not None  # labels are gathered only when the dataset has them
        gather_shards(
            _host_bytes(src), dst, self._permutation, first, nshards, nbs, get_n_threads()
        )

    def get_batch(self, data_batch: Tensor, labels_batch: Tensor | None, ibatch: int) -> None:
        """Copy batch ``ibatch`` into the tensors ``data_batch`` (and ``labels_batch``).

        The batch size is ``nbytes(data_batch)``, which must be a whole number of shards; only
        byte counts and element types are checked, not shapes. Batch ``ibatch`` is shards
        ``permutation[ibatch*spb:(ibatch+1)*spb]``. Every check runs before anything is written.

        Raises
        ------
        DTypeError
            Not tensors, or element types differ from the dataset's.
        ShapeError
            Non-contiguous batch, labels given without dataset labels or missing, batch not a
            whole number of shards, labels batch of the wrong size, ``ibatch`` out of range.
        StateError
            A batch tensor has no memory.

        ggml: ``ggml_opt_dataset_get_batch``.
        """
        fn = "ggml_opt_dataset_get_batch"
        batches = [("data_batch", data_batch)]
        if labels_batch is not None:
            batches.append(("labels_batch", labels_batch))
        for name, t in batches:
            if not isinstance(t, Tensor):
                raise DTypeError(f"{name} must be a Tensor, got {type(t).__name__} ({fn})")
            if not t.is_contiguous():
                raise ShapeError(f"{name} '{t.name}' must be contiguous ({fn})")
        self._check_labels_presence(labels_batch is not None, fn)
        for name, given, ref in (("data_batch", data_batch, self._data),
                                 ("labels_batch", labels_batch, self._labels)):
            if given is not None and ref is not None and given.type != ref.type:
                raise DTypeError(
                    f"{name} '{given.name}' is {given.type.name}, the dataset's {name[:-6]} are "
                    f"{ref.type.name} ({fn})"
                )
        spb = self._shards_per_batch(data_batch.nbytes(), fn)
        if labels_batch is not None and labels_batch.nbytes() != spb * self._nbs_labels:
            raise ShapeError(
                f"labels_batch has {labels_batch.nbytes()} bytes, expected "
                f"{spb * self._nbs_labels} for a batch of {spb} shards ({fn})"
            )
        ibatch = self._check_ibatch(ibatch, spb, fn)
        for name, t in batches:
            if t.buffer is None:
                raise StateError(f"{name} '{t.name}' has no memory; allocate it first ({fn})")
        self._check_destinations([(name, _host_bytes(t)) for name, t in batches if t.is_host],
                                 fn)

        first = ibatch * spb
        for dst, src, nbs in ((data_batch, self._data, self._nbs_data),
                              (labels_batch, self._labels, self._nbs_labels)):
            if dst is None:
                continue
            if dst.is_host:
                self._gather(src, _host_bytes(dst), first, spb, nbs)
            else:
                staging = np.empty(dst.nbytes(), dtype=np.uint8)
                self._gather(src, staging, first, spb, nbs)
                tensor_set(dst, staging.view(dst.type.dtype))

    def get_batch_host(
        self, data_arr: np.ndarray, labels_arr: np.ndarray | None, ibatch: int
    ) -> None:
        """Copy batch ``ibatch`` into NumPy arrays (ggml: ``ggml_opt_dataset_get_batch_host``).

        ``data_arr`` and ``labels_arr`` must be writeable, C-contiguous and of the dataset's
        element types, plain arrays (not ``np.matrix``) apart from each other and from the
        dataset's own storage; the batch size follows from ``data_arr.nbytes``, and
        ``labels_arr`` must hold exactly the matching label bytes. Every check runs before
        anything is written.
        """
        fn = "ggml_opt_dataset_get_batch_host"
        arrays: list[tuple[str, np.ndarray, Tensor | None]] = [("data_arr", data_arr, self._data)]
        if labels_arr is not None:
            arrays.append(("labels_arr", labels_arr, self._labels))
        for name, arr, _ in arrays:
            if not isinstance(arr, np.ndarray) or isinstance(arr, np.matrix):
                raise DTypeError(f"{name} must be a NumPy array (not a matrix, which stays 2-D), "
                                 f"got {type(arr).__name__} ({fn})")
            if not arr.flags.c_contiguous or not arr.flags.writeable:
                raise ShapeError(f"{name} must be C-contiguous and writeable ({fn})")
        self._check_labels_presence(labels_arr is not None, fn)
        for name, arr, ref in arrays:
            if ref is not None and arr.dtype != ref.type.dtype:
                raise DTypeError(
                    f"{name} has dtype {arr.dtype}, the dataset stores {ref.type.dtype} ({fn})"
                )
        spb = self._shards_per_batch(data_arr.nbytes, fn)
        if labels_arr is not None and labels_arr.nbytes != spb * self._nbs_labels:
            raise ShapeError(
                f"labels_arr has {labels_arr.nbytes} bytes, expected "
                f"{spb * self._nbs_labels} for a batch of {spb} shards ({fn})"
            )
        ibatch = self._check_ibatch(ibatch, spb, fn)
        self._check_destinations([(name, arr) for name, arr, _ in arrays], fn)
        first = ibatch * spb
        self._gather(self._data, data_arr.reshape(-1).view(np.uint8), first, spb, self._nbs_data)
        if labels_arr is not None:
            self._gather(
                self._labels, labels_arr.reshape(-1).view(np.uint8), first, spb, self._nbs_labels
            )

    def __repr__(self) -> str:
        labels = "none"
        if self._labels is not None:
            labels = f"{self._labels.type.name}[{self._labels.ne[0]}]"
        return (
            f"Dataset(data={self._data.type.name}[{self._data.ne[0]}], labels={labels}, "
            f"ndata={self._ndata}, ndata_shard={self._ndata_shard})"
        )
