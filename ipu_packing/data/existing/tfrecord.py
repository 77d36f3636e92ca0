"""TFRecord files of tf.train.Example records, read (and written, for tests and benchmarks) without
TensorFlow.

Framing, as TensorFlow's record writer lays it out, record after record:

    uint64 length (little-endian) | uint32 masked_crc(length bytes) | data | uint32 masked_crc(data)

where masked_crc(x) = ((c >> 15) | (c << 17)) + 0xa282ead8 (mod 2**32) of c = CRC-32C (Castagnoli) of
x. Both CRCs of every record are checked (the `crc32c` package computes them). A GZIP-compressed file
(TFRecordOptions("GZIP")) is read through gzip; ZLIB-compressed files are not recognised.

Records are tf.train.Example messages, decoded by tfexample.py.
"""

from __future__ import annotations

import gzip
import os
import struct
from typing import BinaryIO, Iterable, Iterator, List, Optional, Tuple

import numpy as np

_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
GZIP_MAGIC = b"\x1f\x8b"


def _crc32c():
    from ...errors import require_extra

    # the one dependency; imported where records are read or written
    return require_extra("crc32c", "reading TFRecords (their CRC-32C checksums)").crc32c


def masked_crc(data, crc32c=None) -> int:
    """TensorFlow's masked CRC-32C of `data` (any bytes-like object)."""
    c = (crc32c or _crc32c())(data)
    return (((c >> 15) | (c << 17)) + _MASK_DELTA) & 0xFFFFFFFF


class RecordError(Exception):
    """A record that cannot be read: `record` is its index in the file, `cause` says why."""

    def __init__(self, record: int, cause: str) -> None:
        super().__init__("record %d: %s" % (record, cause))
        self.record, self.cause = record, cause


def is_tfrecord(path: str) -> bool:
    """Whether a file starts with a TFRecord header: a length whose masked CRC matches (after gzip's
    decompression for a gzip file)."""
    try:
        with _open(path) as f:
            head = f.read(_HEADER.size)
    except (OSError, EOFError):  # gzip.BadGzipFile is an OSError
        return False
    if len(head) < _HEADER.size:
        return False
    return masked_crc(head[:8]) == _HEADER.unpack_from(head, 0)[1]


def _open(path: str) -> BinaryIO:
    from ...errors import DataError
    from ...fsutil import open_regular

    f = open_regular(path, "rb", error=DataError)
    if f.read(2) == GZIP_MAGIC:
        f.close()
        return gzip.open(path, "rb")  # type: ignore[return-value]
    f.seek(0)
    return f


def read_batches(path: str, block: int = 16 << 20) -> Iterator[Tuple[int, bytes, np.ndarray, np.ndarray]]:
    """Stream a TFRecord file as batches of whole records: (index of the batch's first record, a
    buffer, starts, ends), record i of the batch being buffer[starts[i]:ends[i]]. Both CRCs of every
    record are checked; a bad one, or a file cut inside a record, raises RecordError. A batch holds
    about `block` bytes (at least one record), so memory is bounded by the block, not the file. A record
    length (read from the file) is checked against the bytes the file has left before anything is read for
    it: a length of 2**40 is a RecordError, not a terabyte allocation."""
    header = _HEADER.size
    unpack_header, unpack_crc = _HEADER.unpack_from, _CRC.unpack_from
    crc32c = _crc32c()
    with _open(path) as f:
        size = _plain_size(f)  # None for gzip: its reads stop at the end of the data (_read_at_most)
        index = 0
        carry = b""
        consumed = 0  # bytes of the file before `buf`
        while True:
            chunk = _read_at_most(f, block)
            buf = carry + chunk if carry else chunk
            if not buf:
                return
            starts: List[int] = []
            ends: List[int] = []
            view = memoryview(buf)
            p, n = 0, len(buf)
            while n - p >= header:
                length, length_crc = unpack_header(buf, p)
                c = crc32c(view[p:p + 8])
                if (((c >> 15) | (c << 17)) + _MASK_DELTA) & 0xFFFFFFFF != length_crc:
                    raise RecordError(index + len(starts), "length CRC does not match (corrupt file)")
                end = p + header + length
                if size is not None and consumed + end + 4 > size:
                    raise RecordError(index + len(starts), "its length field says %d bytes, more than the %d "
                                      "bytes left in the file (corrupt or truncated file)"
                                      % (length, max(0, size - consumed - p - header - 4)))
                if end + 4 > n:
                    break  # the record continues in the next block
                c = crc32c(view[p + header:end])
                if (((c >> 15) | (c << 17)) + _MASK_DELTA) & 0xFFFFFFFF != unpack_crc(buf, end)[0]:
                    raise RecordError(index + len(starts), "data CRC does not match (corrupt record)")
                starts.append(p + header)
                ends.append(end)
                p = end + 4
            del view
            if starts:
                yield index, buf, np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64)
                index += len(starts)
            if not chunk:  # end of file
                if p < n:
                    raise RecordError(index, "the file ends inside the record (truncated file)")
                return
            carry = buf[p:]
            consumed += p
            if len(carry) >= header:  # a record larger than the block: read it whole next time
                block = max(block, header + unpack_header(carry, 0)[0] + 4 - len(carry))


def _plain_size(f) -> Optional[int]:
    """The size of an uncompressed file (None for a gzip stream, whose data size is not known ahead)."""
    if isinstance(f, gzip.GzipFile):
        return None
    return os.fstat(f.fileno()).st_size


def _read_at_most(f, size: int, piece: int = 64 << 20) -> bytes:
    """f.read(size), in pieces of at most `piece` bytes and stopping at the end of the data: a size read from
    a gzip file's record header allocates no more than the data holds."""
    if size <= piece:
        return f.read(size)
    parts = []
    while size > 0:
        part = f.read(min(size, piece))
        if not part:
            break
        parts.append(part)
        size -= len(part)
    return b"".join(parts)


def write_records(path: str, records: Iterable[bytes]) -> int:
    """Write `records` as a TFRecord file; returns how many."""
    count = 0
    with open(path, "wb") as f:
        for data in records:
            length = struct.pack("<Q", len(data))
            f.write(length + _CRC.pack(masked_crc(length)) + data + _CRC.pack(masked_crc(data)))
            count += 1
    return count
