"""A run's port series, stored where they carry something.

Every engine samples every port once per interval, but in a fabric of thousands of ports
few carry anything in a given interval: the 64-to-1 incast on fat-tree-k16 fills 27,445
of its 5.1 million (sample, port) cells. A run directory therefore keeps only the cells
in which a port sent, queued, marked, paused, signalled or dropped something, as
entries: `sample_index[e]` (a row of t_ns), `port_index[e]` (a position in `port`) and
each series' value there. A cell with no entry holds 0 in every series. Entries are in
(sample, port) order; no cell has two.

`PortSamples` is what `Run.ports()` returns: a read-only mapping of the names a dense
ports.npz had (`interval_ns`, `t_ns`, `port`, `scale`, then each series as a
[samples, ports] array, built when first asked for), with per-port and per-sample sums,
some ports' rows and every port's row in turn, none of which builds the dense array.
The analysis reads only those: at thousands of ports and hundreds of samples a dense
series is gigabytes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

ENTRY_KEYS = ("sample_index", "port_index")
META_KEYS = ("interval_ns", "t_ns", "port", "scale")


def sparse(series: dict[str, np.ndarray], row0: int = 0) -> dict[str, np.ndarray]:
    """The entries of dense series ([samples, ports] each, one shape): the cells where any
    series is not 0, rows counted from `row0`."""
    arrays = [np.asarray(v) for v in series.values()]
    if not arrays:
        return {k: np.zeros(0, np.int64) for k in ENTRY_KEYS}
    active = np.zeros(arrays[0].shape, dtype=bool)
    for a in arrays:
        active |= a != 0
    s, p = np.nonzero(active)
    out = {"sample_index": (s + row0).astype(np.int64), "port_index": p.astype(np.int64)}
    for name, a in zip(series, arrays, strict=True):
        out[name] = a[s, p]
    return out


def stacked(block: np.ndarray, names, row0: int) -> dict[str, np.ndarray]:
    """The entries of a block of stacked series ([series, samples, ports], as the
    simulator's sample buffer holds them)."""
    active = block.any(axis=0)
    s, p = np.nonzero(active)
    values = block[:, s, p]
    out = {"sample_index": (s + row0).astype(np.int64), "port_index": p.astype(np.int64)}
    out.update(zip(names, values, strict=True))
    return out


def narrow(a) -> np.ndarray:
    """An integer array in the narrowest of uint8, uint16, uint32, int32 and int64 that holds
    its values (how a run directory stores entries); any other array as it is."""
    a = np.asarray(a)
    if a.dtype.kind not in "iu" or a.ndim == 0:
        return a
    lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
    for t in (np.uint8, np.uint16, np.uint32, np.int32):
        if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max:
            return a.astype(t, copy=False)
    return a.astype(np.int64, copy=False)


def wide(a) -> np.ndarray:
    """An integer array as int64 (unsigned narrow types would wrap in differences), any
    other as it is."""
    a = np.asarray(a)
    return a.astype(np.int64) if a.dtype.kind in "iu" and a.dtype != np.int64 else a


def concatenate(parts: list[dict[str, np.ndarray]], names) -> dict[str, np.ndarray]:
    """Entries of consecutive blocks as one set of entries."""
    keys = (*ENTRY_KEYS, *names)
    if not parts:
        return {k: np.zeros(0, np.int64) for k in keys}
    return {k: np.concatenate([p[k] for p in parts]) for k in keys}


class PortSamples(Mapping):
    """A run's port series (module docstring): `ps["tx_bytes"]` is the dense
    [samples, ports] array; `total`, `per_sample`, `peak`, `first`, `nonzero_per_sample`,
    `rows` and `each_row` work on the entries alone."""

    def __init__(self, *, interval_ns, t_ns, port, scale=1.0, sample_index, port_index, **series):
        self.interval_ns = int(np.asarray(interval_ns))
        self.t_ns = np.asarray(t_ns)
        self.port = np.asarray(port)
        self.scale = float(np.asarray(scale))
        self.sample_index = np.asarray(sample_index, dtype=np.int64)
        self.port_index = np.asarray(port_index, dtype=np.int64)
        self.entries = {k: wide(v) for k, v in series.items()}
        self._dense: dict[str, np.ndarray] = {}
        self._port_order: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @classmethod
    def from_arrays(cls, z: dict) -> PortSamples:
        """From a ports.npz's arrays, in either layout: entries (sample_index ...) or
        dense [samples, ports] series (run directories written before entries)."""
        meta = {k: z[k] for k in META_KEYS if k in z}
        series = {k: v for k, v in z.items() if k not in META_KEYS and k not in ENTRY_KEYS}
        if "sample_index" in z:
            return cls(**meta, sample_index=z["sample_index"], port_index=z["port_index"],
                       **series)  # fmt: skip
        return cls(**meta, **sparse(series))

    @property
    def samples(self) -> int:
        return len(self.t_ns)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.entries)

    @property
    def n_entries(self) -> int:
        return len(self.sample_index)

    # the mapping a dense ports.npz was -------------------------------------------------
    def __getitem__(self, key: str) -> np.ndarray:
        if key == "interval_ns":
            return np.asarray(self.interval_ns, dtype=np.int64)
        if key == "scale":
            return np.asarray(self.scale, dtype=np.float64)
        if key in ("t_ns", "port"):
            return getattr(self, key)
        if key in ENTRY_KEYS:
            return getattr(self, key)
        return self.dense(key)

    def __iter__(self) -> Iterator[str]:
        yield from META_KEYS
        yield from self.entries

    def __len__(self) -> int:
        return len(META_KEYS) + len(self.entries)

    def __contains__(self, key) -> bool:
        return key in META_KEYS or key in self.entries

    def dense(self, name: str) -> np.ndarray:
        """Series `name` as [samples, ports] (0 where it has no entry)."""
        if name not in self._dense:
            values = self.entries[name]  # KeyError for a series not recorded
            out = np.zeros((self.samples, len(self.port)), dtype=values.dtype)
            out[self.sample_index, self.port_index] = values
            self._dense[name] = out
        return self._dense[name]

    # figures from the entries alone ------------------------------------------------------
    def total(self, name: str) -> np.ndarray:
        """Per port, the series summed over the samples."""
        return self._sum(name, self.port_index, len(self.port))

    def per_sample(self, name: str, columns=None) -> np.ndarray:
        """Per sample, the series summed over the ports (only over those at the distinct
        positions `columns` in `port`, when given)."""
        if columns is None:
            return self._sum(name, self.sample_index, self.samples)
        mine = np.zeros(len(self.port), dtype=bool)
        mine[np.asarray(columns, dtype=np.int64)] = True
        mine = mine[self.port_index]
        return self._sum(name, self.sample_index[mine], self.samples, mine)

    def _sum(self, name, index, n, mine=None) -> np.ndarray:
        values = self.entries[name] if mine is None else self.entries[name][mine]
        out = np.zeros(n, dtype=np.int64 if values.dtype.kind in "iub" else values.dtype)
        np.add.at(out, index, values)
        return out

    def rows(self, name: str, columns) -> np.ndarray:
        """The series of the ports at the distinct positions `columns` in `port`, as
        [len(columns), samples] (0 where a port has no entry): a few ports' rows of the
        dense array, transposed."""
        columns = np.asarray(columns, dtype=np.int64)
        values = self.entries[name]
        row = np.full(len(self.port), -1, dtype=np.int64)
        row[columns] = np.arange(len(columns))
        at = row[self.port_index]
        mine = at >= 0
        out = np.zeros((len(columns), self.samples), dtype=values.dtype)
        out[at[mine], self.sample_index[mine]] = values[mine]
        return out

    def each_row(self, name: str) -> Iterator[np.ndarray]:
        """Every port's series in `port` order, one [samples] row at a time (0 where it has
        no entry): what the dense array's columns are, never more than one of them held."""
        order, sample, bounds = self._by_port()
        values = self.entries[name]
        for j in range(len(self.port)):
            row = np.zeros(self.samples, dtype=values.dtype)
            a, b = bounds[j], bounds[j + 1]
            row[sample[a:b]] = values[order[a:b]]
            yield row

    def _by_port(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The entries in (port, sample) order (their positions and samples), and where
        each port's begin and end in it."""
        if self._port_order is None:
            order = np.argsort(self.port_index, kind="stable")
            bounds = np.searchsorted(self.port_index[order], np.arange(len(self.port) + 1))
            self._port_order = (order, self.sample_index[order], bounds)
        return self._port_order

    def peak(self, name: str) -> np.ndarray:
        """Per port, the series' largest sample (0 for a port with no entry)."""
        values = self.entries[name]
        out = np.zeros(len(self.port), dtype=values.dtype)
        np.maximum.at(out, self.port_index, values)
        return out

    def first(self, name: str) -> np.ndarray:
        """Per port, the first sample in which the series is not 0 (-1 for none)."""
        hit = self.entries[name] != 0
        out = np.full(len(self.port), self.samples, dtype=np.int64)
        np.minimum.at(out, self.port_index[hit], self.sample_index[hit])
        out[out == self.samples] = -1
        return out

    def nonzero_per_sample(self, name: str) -> np.ndarray:
        """Per sample, the ports whose series is not 0 there."""
        hit = self.entries[name] != 0
        return np.bincount(self.sample_index[hit], minlength=self.samples)

    def arrays(self) -> dict[str, np.ndarray]:
        """ports.npz's arrays: interval_ns, t_ns, port, scale, the entries."""
        return {
            "interval_ns": np.asarray(self.interval_ns, dtype=np.int64),
            "t_ns": self.t_ns,
            "port": self.port,
            "scale": np.asarray(self.scale, dtype=np.float64),
            "sample_index": self.sample_index,
            "port_index": self.port_index,
            **self.entries,
        }
