"""tf.train.Example records decoded (and encoded, for tests and benchmarks) without TensorFlow or
generated protobuf code; the records come from tfrecord.py's framing.

Only the part of the protobuf wire format they use is decoded, by hand:

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }      map entry { string key = 1; Feature value = 2; }
    Feature   { oneof { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    Int64List { repeated int64 value = 1; }              varints, packed (what TensorFlow writes) or not
    FloatList { repeated float value = 1; }              little-endian float32, packed or not

Protobuf's merge rules apply: unknown fields are skipped, a key given twice keeps its last value, a
list given in several pieces is their concatenation. The records' structure is walked in Python; the
values themselves (a few hundred per record) are decoded for a whole batch of records at once with
numpy (`decode_varints`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

from .tfrecord import RecordError


INT64, FLOAT = "int64_list", "float_list"
_KIND_OF_FIELD = {1: "bytes_list", 2: FLOAT, 3: INT64}


def _varint_bytes(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64: two's complement, 10 bytes
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def length_delimited(field: int, payload: bytes) -> bytes:
    return _varint_bytes(field << 3 | 2) + _varint_bytes(len(payload)) + payload


def encode_example(features: Dict[str, Tuple[str, Sequence]]) -> bytes:
    """A tf.train.Example: {name: ("int64_list" | "float_list", values)}, lists packed, as TensorFlow
    writes them."""
    entries = b""
    for name, (kind, values) in features.items():
        if kind == INT64:
            payload = b"".join(_varint_bytes(int(v)) for v in values)
            feature = length_delimited(3, length_delimited(1, payload) if len(values) else b"")
        elif kind == FLOAT:
            payload = np.asarray(values, dtype="<f4").tobytes()
            feature = length_delimited(2, length_delimited(1, payload) if len(values) else b"")
        else:
            raise ValueError("unsupported feature kind %r" % kind)
        entries += length_delimited(1, length_delimited(1, name.encode("utf-8")) + length_delimited(2, feature))
    return length_delimited(1, entries)


class _Malformed(Exception):
    def __init__(self, cause: str, at: int = -1) -> None:
        super().__init__(cause)
        self.at = at  # byte offset of the problem, where known


def _read_varint(buf, p: int, end: int) -> Tuple[int, int]:
    result = shift = 0
    while True:
        if p >= end:
            raise _Malformed("truncated varint")
        b = buf[p]
        p += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, p
        shift += 7
        if shift >= 70:
            raise _Malformed("varint longer than 10 bytes")


def _skip(buf, p: int, end: int, wire: int) -> int:
    """Past an unknown field's value of wire type `wire`."""
    if wire == 0:
        return _read_varint(buf, p, end)[1]
    if wire == 1:
        p += 8
    elif wire == 2:
        n, p = _read_varint(buf, p, end)
        p += n
    elif wire == 5:
        p += 4
    else:
        raise _Malformed("unsupported wire type %d" % wire)
    if p > end:
        raise _Malformed("field runs past the end of its message")
    return p


def _length(buf, p: int, end: int) -> Tuple[int, int]:
    """(start, end) of a length-delimited value at p (after its tag)."""
    b = buf[p] if p < end else 0x80
    if b < 0x80:
        n, p = b, p + 1
    else:
        n, p = _read_varint(buf, p, end)
    if p + n > end:
        raise _Malformed("field runs past the end of its message")
    return p, p + n


def _list_payload(buf, p: int, end: int, kind: str, side: bytearray, base: int) -> Tuple[int, int]:
    """(start, end) of an Int64List's or FloatList's values, packed, in buffer coordinates (those
    past `base` lie in `side`, where values given unpacked or in several pieces are re-laid packed)."""
    pieces = []
    while p < end:
        tag = buf[p]
        if tag == 0x0A:  # field 1, packed
            a, p = _length(buf, p + 1, end)
            pieces.append(bytes(buf[a:p]) if pieces else (a, p))
            continue
        if kind == INT64 and tag == 0x08:  # field 1, one unpacked varint
            a = p + 1
            p = _read_varint(buf, a, end)[1]
        elif kind == FLOAT and tag == 0x0D:  # field 1, one unpacked float
            a, p = p + 1, p + 5
            if p > end:
                raise _Malformed("float runs past the end of its list")
        else:
            tag, q = _read_varint(buf, p, end)
            p = _skip(buf, q, end, tag & 7)
            continue
        pieces.append(bytes(buf[a:p]))
    if not pieces:
        return 0, 0
    if len(pieces) == 1 and isinstance(pieces[0], tuple):
        return pieces[0]
    whole = b"".join(bytes(buf[x[0]:x[1]]) if isinstance(x, tuple) else x for x in pieces)
    start = base + len(side)
    side += whole
    return start, start + len(whole)


def _feature(buf, p: int, end: int, side: bytearray, base: int) -> Tuple[str, int, int]:
    """(kind, payload start, payload end) of a Feature message in buf[p:end]."""
    kind, a, b = "empty", 0, 0
    while p < end:
        tag, p = _read_varint(buf, p, end)
        field, wire = tag >> 3, tag & 7
        if wire == 2 and field in _KIND_OF_FIELD:
            q0, q1 = _length(buf, p, end)
            kind = _KIND_OF_FIELD[field]
            a, b = _list_payload(buf, q0, q1, kind, side, base) if kind != "bytes_list" else (0, 0)
            p = q1
        else:
            p = _skip(buf, p, end, wire)
    return kind, a, b


def parse_features(buf, start: int, end: int, wanted: Dict[bytes, str], side: bytearray,
                   base: int) -> Dict[str, Tuple[str, int, int]]:
    """{name: (kind, payload start, payload end)} of the wanted features of one Example in buf[start:end]."""
    found: Dict[str, Tuple[str, int, int]] = {}
    p = start
    while p < end:
        tag = buf[p]
        if tag != 0x0A:  # not Example.features
            tag, q = _read_varint(buf, p, end)
            p = _skip(buf, q, end, tag & 7)
            continue
        f0, f1 = _length(buf, p + 1, end)
        p = f1
        q = f0
        while q < f1:
            if buf[q] != 0x0A:  # not a map entry
                tag, q = _read_varint(buf, q, f1)
                q = _skip(buf, q, f1, tag & 7)
                continue
            e0, e1 = _length(buf, q + 1, f1)
            q = e1
            key = value = None
            r = e0
            while r < e1:
                tag = buf[r]
                if tag == 0x0A:
                    k0, r = _length(buf, r + 1, e1)
                    key = bytes(buf[k0:r])
                elif tag == 0x12:
                    value = _length(buf, r + 1, e1)
                    r = value[1]
                else:
                    tag, r = _read_varint(buf, r, e1)
                    r = _skip(buf, r, e1, tag & 7)
            name = wanted.get(key) if key is not None else None
            if name is not None:
                found[name] = _feature(buf, value[0], value[1], side, base) if value else ("empty", 0, 0)
    return found


def decode_varints(data: np.ndarray) -> np.ndarray:
    """The int64 values of a run of whole varints in `data` (uint8, its last byte ends a varint)."""
    data = np.asarray(data, dtype=np.uint8)
    last = data < 0x80  # (n,) the last byte of a value
    if last.all():  # every value one byte (0/1 masks and segments, small ids)
        return data.astype(np.int64)
    # Values of up to 3 bytes (ids below 2**21) by whole-array arithmetic, read at each value's last
    # byte e: low[e - 2] | low[e - 1] << 7 | low[e] << 14 for three bytes, and so on.
    low = (data & 0x7F).astype(np.int32)
    more1 = np.zeros(len(data), dtype=bool)  # byte e - 1 belongs to e's value
    more1[1:] = ~last[:-1]
    more2 = np.zeros(len(data), dtype=bool)  # so does e - 2
    more2[2:] = ~last[:-2]
    more2 &= more1
    more3 = np.zeros(len(data), dtype=bool)
    more3[3:] = ~last[:-3]
    if (more3 & more2 & last).any():  # a value of 4 bytes or more (ids >= 2**21, negative numbers)
        return _decode_long_varints(data, last)
    value = low << (7 * (more1.astype(np.int32) + more2))
    value[1:] += np.where(more2[1:], low[:-1] << 7, low[:-1]) * more1[1:]
    value[2:] += low[:-2] * more2[2:]
    return value[last].astype(np.int64)


def _decode_long_varints(data: np.ndarray, last: np.ndarray) -> np.ndarray:
    end_at = np.flatnonzero(last)
    start = np.empty_like(end_at)
    start[:1] = 0
    start[1:] = end_at[:-1] + 1
    size = end_at - start + 1
    too_long = np.flatnonzero(size > 10)
    if len(too_long):
        raise _Malformed("varint longer than 10 bytes", int(start[too_long[0]]))
    which = np.repeat(np.arange(len(size)), size)
    shift = (np.arange(len(data), dtype=np.int64) - start[which]) * 7
    pieces = (data & 0x7F).astype(np.uint64) << shift.astype(np.uint64)
    return np.bitwise_or.reduceat(pieces, start).view(np.int64)


def _gather(u: np.ndarray, at: np.ndarray) -> np.ndarray:
    """u[at] as int64, with positions past the end reading 0x80 (so a varint there never ends)."""
    out = np.full(len(at), 0x80, dtype=np.int64)
    inside = at < len(u)
    out[inside] = u[at[inside]]
    return out


def _varints_at(u: np.ndarray, at: np.ndarray, limit: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values, positions after them, ok) of the varints (up to 5 bytes: lengths) starting at `at`,
    each ending before its `limit`."""
    byte = _gather(u, at)
    value = byte & 0x7F
    going = byte >= 0x80
    size = np.ones(len(at), dtype=np.int64)
    for k in range(1, 5):
        if not going.any():
            break
        idx = np.flatnonzero(going)
        byte = _gather(u, at[idx] + k)
        value[idx] |= (byte & 0x7F) << (7 * k)
        size[idx] += 1
        going[idx] = byte >= 0x80
    after = at + size
    return value, after, ~going & (after <= limit)


def _walk(u: np.ndarray, starts: np.ndarray, ends: np.ndarray, wanted: Dict[bytes, str]):
    """The fast path of `parse_examples`: walk every record's Example at once, level by level, as
    TensorFlow lays it out (features; map entries of key then value; one list per feature, packed).
    Returns (ok, {name: (found, kind tag, payload start, payload end)}); records that are laid out in
    any other way (still valid protobuf, or not) have ok False and go to the general parser."""
    r = len(starts)
    found = {name: (np.zeros(r, bool), np.zeros(r, np.int64), np.zeros(r, np.int64), np.zeros(r, np.int64))
             for name in wanted.values()}
    ok = (_gather(u, starts) == 0x0A) & (ends > starts)
    length, p, good = _varints_at(u, starts + 1, ends)
    ok &= good & (p + length == ends)  # one Features message, the whole record
    by_length: Dict[int, List[Tuple[np.ndarray, str]]] = {}
    for key, name in wanted.items():
        by_length.setdefault(len(key), []).append((np.frombuffer(key, dtype=np.uint8), name))
    active = np.flatnonzero(ok & (p < ends))
    while len(active):
        q, fend = p[active], ends[active]
        good = _gather(u, q) == 0x0A  # a map entry
        n, q, g = _varints_at(u, q + 1, fend)
        entry_end = q + n
        good &= g & (entry_end <= fend)
        good &= _gather(u, q) == 0x0A  # its key
        n, k0, g = _varints_at(u, q + 1, entry_end)
        k1 = k0 + n
        good &= g & (_gather(u, k1) == 0x12)  # then its value, a Feature, to the end of the entry
        n, v0, g = _varints_at(u, k1 + 1, entry_end)
        good &= g & (v0 + n == entry_end)
        tag = _gather(u, v0)
        has_list = v0 < entry_end
        good &= ~has_list | (tag == 0x12) | (tag == 0x1A)  # float_list or int64_list
        n, l0, g = _varints_at(u, v0 + 1, entry_end)
        good &= ~has_list | (g & (l0 + n == entry_end))
        has_values = has_list & (l0 < entry_end)
        good &= ~has_values | (_gather(u, l0) == 0x0A)  # the list's values, packed, to the end
        n, x0, g = _varints_at(u, l0 + 1, entry_end)
        good &= ~has_values | (g & (x0 + n == entry_end))
        x0 = np.where(has_values, x0, 0)
        x1 = np.where(has_values, entry_end, 0)
        tag = np.where(has_list, tag, 0)
        key_length = k1 - k0
        for size, keys in by_length.items():
            rows = np.flatnonzero(good & (key_length == size))
            if not len(rows):
                continue
            key_bytes = u[np.minimum(k0[rows, None] + np.arange(size), len(u) - 1)]  # (rows, size)
            for key, name in keys:
                hit = rows[(key_bytes == key).all(axis=1)]
                seen, kinds, a, b = found[name]
                at = active[hit]
                seen[at], kinds[at], a[at], b[at] = True, tag[hit], x0[hit], x1[hit]  # a repeated key: last wins
        ok[active[~good]] = False
        p[active] = entry_end
        active = active[good & (entry_end < fend)]
    return ok, found


_TAG_KIND = {0: "empty", 0x12: FLOAT, 0x1A: INT64}


@dataclass
class FeatureBatch:
    """One feature over a batch of records: values (flat, record after record) and counts per record."""

    kind: str
    values: np.ndarray  # int64 (int64_list) or float32 (float_list)
    counts: np.ndarray  # (R,) int64


def parse_examples(buf, starts: np.ndarray, ends: np.ndarray, names: Dict[str, str], first: int = 0
                   ) -> Dict[str, FeatureBatch]:
    """The features `names` ({name: "int64_list" | "float_list"}) of the Examples at buf[starts[i]:ends[i]].

    Raises RecordError (records numbered from `first`) for a record that is not a well-formed
    Example, lacks one of the names, or holds it as another kind of list."""
    from ..instance_files import ranges

    u = np.frombuffer(buf, dtype=np.uint8)
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    wanted = {name.encode("utf-8"): name for name in names}
    ok, found = _walk(u, starts, ends, wanted)
    kinds = {name: np.array([_TAG_KIND[t] for t in (0, 0x12, 0x1A)])[np.searchsorted([0, 0x12, 0x1A], found[name][1])]
             for name in names}
    side = bytearray()
    for i in np.flatnonzero(~ok).tolist():  # the general parser, record by record
        try:
            got = parse_features(buf, int(starts[i]), int(ends[i]), wanted, side, len(u))
        except (_Malformed, IndexError) as error:
            raise RecordError(first + i, "not a tf.train.Example (%s)" % error) from None
        for name in names:
            seen, _, a, b = found[name]
            seen[i] = name in got
            if seen[i]:
                kinds[name][i], a[i], b[i] = got[name]
    if side:
        u = np.concatenate([u, np.frombuffer(bytes(side), dtype=np.uint8)])
    out = {}
    for name, kind in names.items():
        seen, _, a, b = found[name]
        missing = np.flatnonzero(~seen)
        if len(missing):
            raise RecordError(first + int(missing[0]), "feature %r is missing" % name)
        wrong = np.flatnonzero((kinds[name] != kind) & (kinds[name] != "empty"))
        if len(wrong):
            raise RecordError(first + int(wrong[0]), "feature %r is a %s, expected a %s"
                              % (name, kinds[name][wrong[0]], kind))
        lengths = b - a
        data = u[ranges(a, lengths)]
        if kind == FLOAT:
            bad = np.flatnonzero(lengths % 4)
            if len(bad):
                raise RecordError(first + int(bad[0]), "feature %r: a float list of %d bytes" % (name, lengths[bad[0]]))
            out[name] = FeatureBatch(kind, data.view("<f4").astype(np.float32), lengths // 4)
            continue
        nonempty = np.flatnonzero(lengths)
        cut = nonempty[u[b[nonempty] - 1] >= 0x80]
        if len(cut):
            raise RecordError(first + int(cut[0]), "feature %r: its last value is cut short" % name)
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        try:
            values = decode_varints(data)
        except _Malformed as error:
            record = int(np.searchsorted(bounds, error.at, side="right") - 1)
            raise RecordError(first + record, "feature %r: %s" % (name, error)) from None
        ends_in = np.concatenate([[0], np.cumsum(data < 0x80, dtype=np.int64)])
        out[name] = FeatureBatch(kind, values, ends_in[bounds[1:]] - ends_in[bounds[:-1]])
    return out
