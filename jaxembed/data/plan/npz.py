"""The .npz files of plans and instance orders: written in ``np.savez``'s layout (one uncompressed .npy member per
array) a block at a time, and read back with the large arrays memory-mapped, so neither side needs a whole array
in memory."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Callable, Collection

import numpy as np


def write_npz(path: Path, arrays: dict[str, np.ndarray | Callable], read_rows: Callable, block: Callable,
              on_rows: Callable | None = None) -> None:
    """The layout of ``np.savez`` (uncompressed .npy members, zip64 headers); each array ``a`` written ``block(a)``
    rows at a time (``read_rows(a, r0, r1)``: rows [r0, r1) of a, e.g. by positioned reads from its file), each
    block passed to ``on_rows(name, r0, rows)`` as it is written. A value that is a function is called when its
    member is reached: an array computed from the members written before it (their digests)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, a in arrays.items():
            a = a() if callable(a) else a
            with zf.open(name + ".npy", "w", force_zip64=True) as f:
                np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(a.dtype),
                                                         "fortran_order": False, "shape": a.shape})
                n = block(a)
                for r0 in range(0, len(a), n):
                    rows = np.ascontiguousarray(read_rows(a, r0, r0 + n))
                    if on_rows is not None:
                        on_rows(name, r0, rows)
                    f.write(rows.tobytes())


def mapped_npz(path, mapped: Collection[str]) -> dict[str, np.ndarray]:
    """The arrays of an .npz file; those named in ``mapped`` memory-mapped where stored uncompressed (as
    ``np.savez`` and ``write_npz`` write them), so a reader pages in only the rows it reads."""
    out = {}
    with zipfile.ZipFile(path) as zf, open(path, "rb") as f:
        for info in zf.infolist():
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            if name in mapped and info.compress_type == zipfile.ZIP_STORED:
                f.seek(info.header_offset)
                head = f.read(30)  # the local file header: name and extra field lengths at bytes 26..29
                n_name, n_extra = int.from_bytes(head[26:28], "little"), int.from_bytes(head[28:30], "little")
                f.seek(info.header_offset + 30 + n_name + n_extra)
                version = np.lib.format.read_magic(f)
                read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                    np.lib.format.read_array_header_2_0
                shape, fortran, dtype = read_header(f)
                if not fortran and not dtype.hasobject and int(np.prod(shape)) > 0:
                    out[name] = np.memmap(path, dtype=dtype, mode="r", offset=f.tell(), shape=shape)
                    continue
            with zf.open(info) as m:
                out[name] = np.lib.format.read_array(m, allow_pickle=False)
    return out
