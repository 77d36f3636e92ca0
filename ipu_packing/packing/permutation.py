"""Seeded pseudo-random permutations computed pointwise (keyed Feistel networks): the shuffles of the
assignment (slots.py says where each is used). A bijection of [0, n) evaluated element by element,
vectorised, in O(1) memory, with its inverse, instead of a stored shuffle of n entries; integer
arithmetic only, so it is the same on every machine.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
# elements per vectorised step: its temporaries (a few int64 arrays of CHUNK) stay in the L2 cache.
# Results never depend on it (tests/test_packing_slots.py places with several).
CHUNK = 1 << 13
# a permutation whose Feistel domain has at most this many points is computed on all of it at once
# when asked for at least a quarter of it (KeyedPermutation._everywhere)
SMALL_DOMAIN = 1 << 14


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a fast, well-tested 64-bit mixing function (uint64 -> uint64)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class KeyedPermutation:
    """A seeded pseudo-random permutation of [0, n), computed pointwise.

    A Feistel network of ROUNDS rounds permutes [0, 2^b) for the smallest b >= 2 with 2^b >= n:
    a value is a high part of ceil(b/2) bits and a low part of floor(b/2) bits (one bit apart
    when b is odd), and each round xors a keyed function of one part into the other and swaps
    them. Values that land at or past n are sent through it again ("cycle walking") until they
    land inside, which keeps it a bijection of [0, n); as 2^b < 2n (n > 2), that takes under 2
    passes on average. Its round function is splitmix64 of the part xor a round key.

    Evaluation (the same bits every way): a part takes at most 2^ceil(b/2) values, so where that
    is at most 2^TABLE_BITS each round's function is tabulated once (built on first use, not
    pickled) and a round is a table look-up and an xor; above that it is computed. The network
    runs on CHUNK values at a time; cycle walking keeps the values still outside [0, n) in a pool
    that passes through the network once it holds a chunk's worth (`_apply`), and a small domain
    asked for much of itself is computed whole (`_everywhere`).
    """

    ROUNDS = 6  # even: the parts end where they started
    TABLE_BITS = 16

    def __init__(self, n: int, seed: int, *spawn_key: int) -> None:
        self.n = int(n)
        self.bits = max(2, (max(self.n, 1) - 1).bit_length())  # the network permutes [0, 2^bits)
        self.high, self.low = (self.bits + 1) // 2, self.bits // 2  # widths of the two parts
        state = np.random.SeedSequence(seed, spawn_key=spawn_key).generate_state(self.ROUNDS, np.uint64)
        self.keys = [np.uint64(k) for k in state]
        self._tables = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_tables"] = None  # rebuilt where used: keeps the pickle O(ROUNDS)
        return state

    def _widths(self, i: int) -> Tuple[int, int]:
        """Round i reads a part of the first width and xors into one of the second."""
        return (self.low, self.high) if i % 2 == 0 else (self.high, self.low)

    def _round_tables(self):
        """ROUNDS int64 tables: round i's F_i(v) = splitmix64(v ^ key_i) & (2^out - 1) for every
        value v of the part it reads, or None where a part exceeds TABLE_BITS."""
        if self._tables is None and self.high <= self.TABLE_BITS:
            tables = [None] * self.ROUNDS
            for parity in (0, 1):  # the even rounds read parts of one width, the odd ones of the other
                width, out = self._widths(parity)
                keys = np.array(self.keys[parity::2], dtype=np.uint64)[:, None]
                words = np.arange(1 << width, dtype=np.uint64)[None, :]
                tables[parity::2] = list((_mix(words ^ keys) & np.uint64((1 << out) - 1)).astype(np.int64))
            self._tables = tables
        return self._tables

    def _computed(self, x: np.ndarray, forward: bool) -> np.ndarray:
        """The network without tables, on (n,) uint64."""
        shift = np.uint64(self.low)
        left, right = x >> shift, x & np.uint64((1 << self.low) - 1)
        rounds = range(self.ROUNDS) if forward else range(self.ROUNDS - 1, -1, -1)
        for i in rounds:
            mask = np.uint64((1 << self._widths(i)[1]) - 1)
            if forward:  # (L, R) -> (R, L ^ F(R))
                left, right = right, left ^ (_mix(right ^ self.keys[i]) & mask)
            else:  # (L, R) -> (R ^ F(L), L)
                left, right = right ^ (_mix(left ^ self.keys[i]) & mask), left
        return (left << shift) | right

    def _network(self, x: np.ndarray, forward: bool) -> np.ndarray:
        """The Feistel network (or its inverse) on (n,) int64 x in [0, 2^b): (n,) int64, new array."""
        tables = self._round_tables()
        if tables is None:
            return self._computed(x.astype(np.uint64), forward).astype(np.int64)
        shift = self.low
        left = np.right_shift(x, shift)
        right = np.bitwise_and(x, (1 << shift) - 1)
        looked_up = np.empty_like(left)
        if forward:  # (L, R) -> (R, L ^ F(R))
            for table in tables:
                table.take(right, mode="clip", out=looked_up)
                np.bitwise_xor(left, looked_up, out=left)
                left, right = right, left
        else:  # (L, R) -> (R ^ F(L), L), rounds in reverse
            for table in tables[::-1]:
                table.take(left, mode="clip", out=looked_up)
                np.bitwise_xor(right, looked_up, out=right)
                left, right = right, left
        np.left_shift(left, shift, out=left)
        return np.bitwise_or(left, right, out=left)

    def _apply(self, x, forward: bool, chunk: int = 0, out: Optional[np.ndarray] = None) -> np.ndarray:
        """pi or pi^-1 of x, (m,) int64 in [0, n) (unchecked) or a range: into `out` ((m,), any
        integer type that holds n) or a new (m,) int64 array.

        Cycle walking in a pool: the values that land at or past n wait in it (with their places in
        the result) and take their next pass through the network together, once the pool holds a
        chunk's worth, so that the network always runs on large arrays, never on a walk's tail.
        """
        chunk = chunk or CHUNK
        n, domain = self.n, 1 << self.bits
        if out is None:
            out = np.empty(len(x), dtype=np.int64)
        if domain <= SMALL_DOMAIN and 4 * len(x) >= domain:
            everywhere = self._everywhere(forward, chunk)
            out[:] = everywhere[x.start:x.stop] if isinstance(x, range) else everywhere[x]
            return out
        at = np.empty(2 * chunk, dtype=np.int64)  # the pool: places in `out` ...
        pool = np.empty(2 * chunk, dtype=np.int64)  # ... and the values waiting there
        fill = 0
        for a in range(0, len(x), chunk):
            part = x[a:a + chunk]
            y = self._network(np.arange(part.start, part.stop, dtype=np.int64) if isinstance(part, range) else part,
                              forward)
            out[a:a + len(y)] = y
            outside = np.flatnonzero(y >= n)
            np.add(outside, a, out=at[fill:fill + len(outside)])
            np.take(y, outside, out=pool[fill:fill + len(outside)])
            fill += len(outside)
            while fill >= chunk:
                fill = self._pass(out, at, pool, fill, forward)
        while fill:
            fill = self._pass(out, at, pool, fill, forward)
        return out

    def _pass(self, out: np.ndarray, at: np.ndarray, pool: np.ndarray, fill: int, forward: bool) -> int:
        """One more pass of pool[:fill] through the network; returns how many still wait."""
        y = self._network(pool[:fill], forward)
        out[at[:fill]] = y  # final where inside [0, n); the others are written again later
        outside = np.flatnonzero(y >= self.n)
        at[:len(outside)] = at[outside]
        pool[:len(outside)] = y[outside]
        return len(outside)

    def _everywhere(self, forward: bool, chunk: int = 0, out: Optional[np.ndarray] = None) -> np.ndarray:
        """pi (or pi^-1) of all of [0, n): into `out` ((n,), any integer type that holds n) or a new
        (n,) int64 array.

        A small domain is done all at once: the network is applied once to each point of [0, 2^b),
        then every pointer that points outside [0, n) jumps to where the point it points to points
        (doubling) until it rests inside, which is where cycle walking stops. (Points on a cycle that
        never enters [0, n) never rest, but no x in [0, n) is waiting on them.)
        """
        chunk = chunk or CHUNK
        n, domain = self.n, 1 << self.bits
        if domain > SMALL_DOMAIN:
            return self._apply(range(n), forward, chunk, out)
        jump = np.empty(domain, dtype=np.int64)
        for c in range(0, domain, chunk):
            jump[c:c + chunk] = self._network(np.arange(c, min(c + chunk, domain), dtype=np.int64), forward)
        away = np.flatnonzero(jump >= n)  # once a pointer rests inside, it stays
        waiting = away[away < n]
        while waiting.size:
            jump[away] = jump[jump[away]]
            away = away[jump[away] >= n]
            waiting = waiting[jump[waiting] >= n]
        if out is None:
            return jump[:n].copy()
        out[:] = jump[:n]
        return out

    def _walk(self, x, forward: bool, chunk: int) -> np.ndarray:
        x = np.atleast_1d(np.asarray(x))
        if x.size and not np.issubdtype(x.dtype, np.integer):
            raise ValueError("permutation argument must be integers, got dtype %s" % x.dtype)
        if x.size and (int(x.min()) < 0 or int(x.max()) >= self.n):
            raise ValueError("permutation argument outside [0, %d)" % self.n)
        return self._apply(x.astype(np.int64).ravel(), forward, chunk).reshape(x.shape)

    def __call__(self, x, chunk: int = 0) -> np.ndarray:
        """pi(x), int64, for x in [0, n); `chunk` (default CHUNK) changes only the speed."""
        return self._walk(x, True, chunk)

    def inverse(self, y, chunk: int = 0) -> np.ndarray:
        """pi^-1(y), int64, for y in [0, n); `chunk` (default CHUNK) changes only the speed."""
        return self._walk(y, False, chunk)
