"""Damaged run directories: every file truncated, corrupted, swapped, deleted or edited.

`mutate(data, run_dir)` applies one mutation drawn from hypothesis's `data` to
the run directory (its JSON, .npz and Parquet files): bytes cut or
overwritten, one file's bytes put in another's place, a file removed, a JSON
value replaced anywhere in run.json or topology.json, or an array of an .npz
replaced by one of another dtype, shape or range, or removed.
`outcome(result)` is what the CLI must answer: exit 0, or exit 1 with one
sentence naming the run directory or one of its files; never a traceback or a
numpy warning. tests/test_rundir_damage.py runs a few hundred in the default
suite and 10,000 marked slow.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

FILES = (
    "run.json", "topology.json", "flows.npz", "ports.npz", "collectives.npz",
    "flows.parquet", "ports.parquet", "collectives.parquet",
)  # fmt: skip
EXTREMES = (-(2**63), -(2**31), -2, -1, 0, 1, 2, 7, 2**31 - 1, 2**31, 2**62, 2**63 - 1)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.sampled_from(EXTREMES)
    | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip


def _save_npz(path: Path, arrays: dict) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path.write_bytes(buf.getvalue())


def _bytes(data, path: Path) -> None:
    raw = bytearray(path.read_bytes())
    how = data.draw(st.sampled_from(["truncate", "flip", "zero", "append"]))
    if how == "truncate":
        raw = raw[: data.draw(st.integers(0, max(len(raw) - 1, 0)))]
    elif how == "append":
        raw += data.draw(st.binary(min_size=1, max_size=64))
    elif raw:
        for _ in range(data.draw(st.integers(1, 8))):
            at = data.draw(st.integers(0, len(raw) - 1))
            raw[at] = data.draw(st.integers(0, 255)) if how == "flip" else 0
    path.write_bytes(bytes(raw))


def _json_edit(data, path: Path) -> None:
    doc = json.loads(path.read_text())
    if data.draw(st.integers(0, 9)) == 0:
        doc = data.draw(JSON_VALUES)  # the whole file another value
    else:
        picked = pick(data, doc)
        if picked is not None:
            node, key = picked
            if data.draw(st.integers(0, 5)) == 0:
                del node[key]
            else:
                node[key] = data.draw(JSON_VALUES)
    path.write_text(json.dumps(doc))


def pick(data, doc):
    """(container, key) of a place drawn in the JSON document `doc`, going down into a nested
    table or list at random; None for an empty document."""
    node = doc
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            return None
        key = data.draw(st.sampled_from(keys))
        child = node[key]
        if isinstance(child, dict | list) and child and data.draw(st.booleans()):
            node = child
            continue
        return node, key


def _array_edit(data, path: Path) -> None:
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    key = data.draw(st.sampled_from(sorted(arrays)))
    a = arrays[key]
    how = data.draw(
        st.sampled_from(["drop", "dtype", "shape", "value", "empty", "scalar", "text", "nan"])
    )
    if how == "drop":
        del arrays[key]
    elif how == "dtype":
        dtype = data.draw(st.sampled_from([np.float64, np.int8, np.bool_, "U3"]))
        arrays[key] = a.astype(dtype if a.dtype.kind != "U" else "U3")
    elif how == "shape":
        arrays[key] = a.reshape(-1)[: max(a.size - 1, 0)] if a.ndim else np.array([a, a])
        if data.draw(st.booleans()) and a.size:
            arrays[key] = a.reshape(1, *a.shape)
    elif how == "value" and a.size and a.dtype.kind in "iu":
        a = a.astype(np.int64).copy()
        a.reshape(-1)[data.draw(st.integers(0, a.size - 1))] = data.draw(st.sampled_from(EXTREMES))
        arrays[key] = a
    elif how == "empty":
        arrays[key] = a[:0] if a.ndim else np.zeros(0, a.dtype)
    elif how == "scalar":
        arrays[key] = np.array(data.draw(st.sampled_from(EXTREMES)))
    elif how == "text":
        arrays[key] = np.array(["x"] * max(a.size, 1))
    elif how == "nan" and a.size and a.dtype.kind in "iuf":
        a = a.astype(np.float64).copy()
        a.reshape(-1)[0] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf, -1.0, 1e300]))
        arrays[key] = a
    _save_npz(path, arrays)


def mutate(data, run_dir: Path) -> str:
    """One mutation of `run_dir` drawn from `data`; returns what it did, for the report."""
    present = [f for f in FILES if (run_dir / f).is_file()]
    name = data.draw(st.sampled_from(present))
    path = run_dir / name
    how = data.draw(st.sampled_from(["bytes", "swap", "delete", "edit", "edit", "edit"]))
    if how == "bytes":
        _bytes(data, path)
    elif how == "swap":
        other = data.draw(st.sampled_from([f for f in present if f != name]))
        path.write_bytes((run_dir / other).read_bytes())
    elif how == "delete":
        path.unlink()
    elif name.endswith(".json"):
        _json_edit(data, path)
    elif name.endswith(".npz"):
        _array_edit(data, path)
    else:  # a Parquet table: its bytes (the arrays are the .npz's, column for column)
        _bytes(data, path)
    return f"{how} {name}"


def outcome(result, run_dir: Path) -> str | None:
    """What is wrong with the CLI's answer to a damaged run directory, or None."""
    out = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return f"raised {type(result.exception).__name__}: {result.exception}"
    if "Traceback" in out or any(
        "Warning: " in line and not line.startswith("Warning: ") for line in out.splitlines()
    ):
        return f"printed a traceback or a Python warning: {out[-400:]}"
    if result.exit_code == 0:
        return None
    if result.exit_code != 1:
        return f"exit {result.exit_code}: {out[-400:]}"
    errors = [line for line in out.splitlines() if line.startswith("Error: ")]
    if len(errors) != 1 or out.strip().splitlines()[-1] != errors[0]:
        return f"not one sentence: {out[-400:]}"
    if str(run_dir) not in errors[0]:
        return f"the sentence names neither the run directory nor its file: {errors[0]}"
    return None
