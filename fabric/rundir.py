"""The run directory: what every engine writes and the analyzer reads.

One run = one scenario on one engine. Files, each written atomically (a
temporary file renamed into place, so a reader never sees half of one):

    run.json         schema, engine, status, scenario, versions, times, message
    topology.json    aifabric.fabric.export.topology_dict(fabric)
    flows.npz        per flow (one QP's transfer): flow_id job op step channel src dst
                     sqpn dqpn sport bytes start_ns end_ns (end_ns -1: unfinished; where
                     it is measured: run.json features.finish),
                     path_ptr int64[n + 1] and path_link: the links flow f used are
                     path_link[path_ptr[f]:path_ptr[f + 1]], in order;
                     optional: route_epoch, which routing chose flow f's route (0 the
                     one at the start, k the one after the run's k-th fault during
                     the run; the simulator writes it), delivered_bytes (the payload
                     bytes its receiver has; the simulator writes it)
    ports.npz        per-port time series at a fixed interval:
                     interval_ns; t_ns[s] (start of sample s); port[p] (the port ids
                     recorded, see aifabric.fabric.model); scale (emulation rate factor, 1 in sim);
                     arrays [samples, ports]: tx_bytes, qdepth_max_bytes,
                     qdepth_mean_bytes, ecn_marked, paused_ns, pfc_sent, drops;
                     optional (OPTIONAL_PORT_SERIES, where the engine counts it):
                     cnp_sent, the CNPs a NIC sent, on the NIC's own port, in the
                     sample its receiver generated them (the simulator writes it,
                     summing to run.json's cnp_sent; the emulator's switch monitor
                     does not see its hosts' CNPs and leaves it out)
    collectives.npz  per collective op: op job kind algorithm bytes ranks start_ns
                     end_ns algbw_bps busbw_bps (nccl-tests convention); busbw_factor
                     (busbw / algbw, recorded also for ops that did not finish; runs
                     written before it was recorded lack it)
    captures/*.pcap  packet captures where taken
    live.json        while the engine runs, its figures so far, rewritten at most once a
                     second (aifabric.fabric.live: simulated time, events, flows done,
                     the series' totals, each job's delivered bytes and rate, the
                     busiest ports); a last time, with final true, after the results
                     above are written. What `aifabric watch` shows of a run in
                     progress; readers of a finished run need only the files above

The same flows, port series and collectives are also tables, for DuckDB, pandas and
Arrow (`aifabric.fabric.columnar`; Parquet, zstd): each NAME.parquet holds NAME.npz's
arrays column for column, under the same names (units in them), plus readable names
beside ids, and null where an array says "never" with -1:

    flows.parquet        one row per flow: every flows.npz array (start_ns, end_ns null
                         where -1), job_name (the workload's job names,
                         aifabric.fabric.scenario.job_names), src_name, dst_name (NIC
                         names), fct_ns (end_ns - start_ns of a finished flow, else null),
                         path_link (list: the flow's links, in order)
    ports.parquet        one row per recorded port and sample (long form; each port's
                         samples together, in time order): t_ns, port, port_name,
                         node_name and peer_name (the port's node and the node it sends
                         to), node_role and peer_role (nic, rtsw, ctsw, atsw),
                         interval_ns, then every series of ports.npz (tx_bytes ...
                         drops, cnp_sent where recorded); key-value metadata `aifabric`
                         (JSON): interval_ns, scale, the recorded ports, the arrays' dtypes
    collectives.parquet  one row per op: every collectives.npz array (start_ns, end_ns
                         null where -1; algbw_bps and busbw_bps null where the op has no
                         time, 0 in the npz), job_name

Names come from topology.json's fabric and run.json's workload; a run written without
them (a test's writer) has the ids alone. The `.npz` files stay: numpy alone loads them,
and `Run.flows()`, `.ports()` and `.collectives()` read them first; a run directory that
holds only the Parquet files reads the same arrays from them (`Run.table` gives a table
itself; a file that is not whole Parquet is one sentence).

`status` is "running" while an engine works, then "complete", "partial"
(interrupted, or not every flow finished: what is there is real but not
everything ran) or "failed" (an error; `message` says which). While it runs,
the process holds a lock on `run.lock` (and run.json records its pid and
host); a run whose run.json still says "running" but whose lock nobody
holds was killed (SIGKILL, a crash, power loss): readers see the status
"killed" (`effective_status`). Arrays load with numpy alone
(`np.load(path, allow_pickle=False)`).
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from aifabric.fabric.errors import AifabricError
from aifabric.fabric.files import replace_atomic, why_not_written

RUN_SCHEMA = "aifabric.run/1"
STATUSES = ("running", "complete", "partial", "failed")
KILLED = "killed"  # what readers make of "running" when no process holds the run's lock
LOCK = "run.lock"
FLOW_FIELDS = (
    "flow_id", "job", "op", "step", "channel", "src", "dst", "sqpn", "dqpn", "sport",
    "bytes", "start_ns", "end_ns", "path_ptr", "path_link",
)  # fmt: skip
PORT_SERIES = (
    "tx_bytes", "qdepth_max_bytes", "qdepth_mean_bytes", "ecn_marked", "paused_ns",
    "pfc_sent", "drops",
)  # fmt: skip
OPTIONAL_PORT_SERIES = ("cnp_sent",)
TABLES = ("flows", "ports", "collectives")  # NAME.parquet beside NAME.npz
COLLECTIVE_FIELDS = (
    "op", "job", "kind", "algorithm", "bytes", "ranks", "start_ns", "end_ns",
    "algbw_bps", "busbw_bps",
)  # fmt: skip
# the kinds of op whose `bytes` are all its flows' together (aifabric.traffic.spec.PATTERNS and a
# traffic matrix); a collective's are each rank's message, as in nccl-tests
SIZE_IN_ALL = ("permutation", "incast", "uniform", "matrix")


def write_json(path: Path, data: Any) -> None:
    def w(tmp):
        with open(tmp, "w") as fh:
            json.dump(data, fh, indent=1, default=jsonable)
            fh.write("\n")

    replace_atomic(path, w)


def write_npz(path: Path, arrays: dict[str, Any]) -> None:
    def w(tmp):
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)

    replace_atomic(path, w)


def jsonable(x):
    """What `json.dump` cannot write itself (numpy scalars and arrays, paths), as JSON values:
    run.json's `default`, and a sweep's digest of a scenario."""
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"{type(x).__name__} is not JSON serializable")


def versions() -> dict[str, str]:
    import numba

    from aifabric.fabric import __version__

    return {
        "aifabric": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
    }


def check_run_dir(path: str | Path, *, replace: bool = False) -> None:
    """One sentence, before any work, when `path` cannot become a new run directory;
    with `replace`, an existing run directory will do (`remove_run_dir` clears it when
    the run is about to start), unless a live run is writing it."""
    path = where = Path(path)
    try:
        if path.exists():
            if not path.is_dir():
                raise AifabricError(f"run directory {path} exists and is not a directory")
            if any(path.iterdir()):
                if not replace:
                    raise AifabricError(
                        f"run directory {path} already exists and is not empty "
                        "(--force replaces a run directory)"
                    )
                if not (path / "run.json").is_file():
                    raise AifabricError(
                        f"{path} is not a run directory (no run.json); not replacing it"
                    )
                if effective_status(path) == "running":
                    raise AifabricError(f"{path} belongs to a run in progress; not replacing it")
        else:
            where = path.parent
            while not where.exists():
                where = where.parent
            if not where.is_dir():
                raise AifabricError(f"cannot make run directory {path}: {where} is not a directory")
        os.rmdir(tempfile.mkdtemp(dir=where, prefix=".aifabric-probe-"))
    except OSError as e:
        why = why_not_written(where / ".aifabric-probe", e)
        raise AifabricError(f"cannot write run directory {path}: {why}") from None


class RunWriter:
    """Creates a run directory and keeps run.json's status honest.

    It holds `run.lock` from creation to `finish()`, so that a reader can tell
    a run in progress from one whose process died (`effective_status`).
    """

    def __init__(
        self,
        path: str | Path,
        engine: str,
        scenario: dict[str, Any],
        features: dict[str, Any] | None = None,
    ):
        self.path = Path(path)
        check_run_dir(self.path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            (self.path / "captures").mkdir(exist_ok=True)
            self._lock = os.open(self.path / LOCK, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise AifabricError(f"cannot write run directory {self.path}: {e.strerror}") from None
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        os.write(self._lock, f"{os.getpid()}\n".encode())
        self._started = time.time()
        self.meta: dict[str, Any] = {
            "schema": RUN_SCHEMA,
            "engine": engine,
            "status": "running",
            "scenario": scenario,
            "features": features or {},
            "versions": versions(),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._started)),
            "wall_time_s": None,
            "message": "",
            "results": {},
        }
        self._write_meta()

    def _write_meta(self) -> None:
        write_json(self.path / "run.json", self.meta)

    def topology(self, fabric) -> None:
        from aifabric.fabric.export import topology_dict

        write_json(self.path / "topology.json", topology_dict(fabric))
        self._fabric = fabric

    def _names(self):
        """The names the Parquet tables put beside ids: the fabric's (once `topology` wrote
        it) and the jobs' (`job_names` of the scenario's workload)."""
        from aifabric.fabric.columnar import Names
        from aifabric.fabric.scenario import job_names

        scenario = self.meta["scenario"]
        workload = scenario.get("workload") if isinstance(scenario, dict) else None
        try:
            jobs = job_names(workload) if isinstance(workload, dict) else []
        except (AttributeError, TypeError):  # a workload that names no jobs the usual way
            jobs = []
        return Names(getattr(self, "_fabric", None), jobs)

    def flows(self, **cols) -> None:
        from aifabric.fabric.columnar import flows_table, write_parquet

        missing = [k for k in FLOW_FIELDS if k not in cols]
        if missing:
            raise ValueError(f"flow records lack {', '.join(missing)}")
        write_npz(self.path / "flows.npz", cols)
        write_parquet(self.path / "flows.parquet", flows_table(cols, self._names()))

    def ports(self, *, interval_ns: int, t_ns, port, scale: float = 1.0, **series) -> None:
        missing = [k for k in PORT_SERIES if k not in series]
        if missing:
            raise ValueError(f"port series lack {', '.join(missing)}")
        unknown = [k for k in series if k not in PORT_SERIES + OPTIONAL_PORT_SERIES]
        if unknown:
            raise ValueError(f"port series {', '.join(unknown)} are not in the run format")
        from aifabric.fabric.columnar import ports_tables, write_parquet

        write_npz(
            self.path / "ports.npz",
            {"interval_ns": interval_ns, "t_ns": t_ns, "port": port, "scale": scale, **series},
        )
        tables = ports_tables(interval_ns, t_ns, port, scale, series, self._names())
        write_parquet(self.path / "ports.parquet", tables)

    def collectives(self, **cols) -> None:
        from aifabric.fabric.columnar import collectives_table, write_parquet

        missing = [k for k in COLLECTIVE_FIELDS if k not in cols]
        if missing:
            raise ValueError(f"collective records lack {', '.join(missing)}")
        write_npz(self.path / "collectives.npz", cols)
        write_parquet(self.path / "collectives.parquet", collectives_table(cols, self._names()))

    def capture_path(self, port_name: str) -> Path:
        """Where the capture of the port named `port_name` (`Fabric.port_name`) goes."""
        return self.path / "captures" / f"{port_name}.pcap"

    def note(self, **results) -> None:
        """Record results or facts about the run (mechanisms used, counters) in run.json."""
        self.meta["results"].update(results)
        self._write_meta()

    def finish(self, status: str, message: str = "") -> None:
        if status not in STATUSES[1:]:
            raise ValueError(f"a run ends complete, partial or failed, not {status!r}")
        self.meta["status"] = status
        self.meta["message"] = message
        self.meta["wall_time_s"] = round(time.time() - self._started, 3)
        self._write_meta()
        if self._lock is not None:
            (self.path / LOCK).unlink(missing_ok=True)
            os.close(self._lock)
            self._lock = None


def _lock_held(path: Path, meta: dict) -> bool:
    """Whether a live process holds the run's lock (for runs without one: its pid lives)."""
    try:
        fd = os.open(path / LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        if meta.get("status") != "running":
            return False
        pid, host = meta.get("pid"), meta.get("host")
        if not isinstance(pid, int) or host != socket.gethostname():
            return True  # nothing to tell by: take run.json's word
        return Path(f"/proc/{pid}").exists()
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def hold_lock(path: str | Path, busy: str) -> int:
    """Create the lock file `path` and lock it for this process, which keeps it until
    `release_lock` or its end; `busy` is the sentence when another process holds it."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise AifabricError(f"cannot write {path}: {why_not_written(path, e)}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AifabricError(busy) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def release_lock(path: str | Path, fd: int) -> None:
    Path(path).unlink(missing_ok=True)
    os.close(fd)


def lock_held(path: str | Path) -> bool:
    """Whether a live process holds the lock file `path` (`hold_lock`; False when absent)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def effective_status(path: str | Path, meta: dict | None = None) -> str:
    """run.json's status, except "killed" for a run that says "running" but whose process
    is gone (nobody holds its lock)."""
    path = Path(path)
    if meta is None:
        meta = json.loads((path / "run.json").read_text())
    status = meta.get("status")
    if status == "running" and not _lock_held(path, meta):
        return KILLED
    return status


class Run:
    """A run directory opened for reading; arrays load lazily."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        meta = self.path / "run.json"
        if not meta.is_file():
            raise AifabricError(f"{self.path} is not a run directory (no run.json)")
        try:
            self.meta = json.loads(meta.read_text())
        except (OSError, ValueError) as e:
            raise AifabricError(f"{meta} cannot be read: {e}") from None
        if self.meta.get("schema") != RUN_SCHEMA:
            raise AifabricError(f"{meta} is not an {RUN_SCHEMA} run record")
        if effective_status(self.path, self.meta) == KILLED:
            self.meta["status"] = KILLED
            self.meta["message"] = (
                f"its process (pid {self.meta.get('pid', '?')}) ended without finishing the run "
                "(killed, crashed or the machine stopped); what it wrote is real"
            )

    @property
    def status(self) -> str:
        return self.meta["status"]

    @property
    def engine(self) -> str:
        return self.meta["engine"]

    def topology(self) -> dict:
        return json.loads((self.path / "topology.json").read_text())

    def _arrays(self, name: str) -> dict[str, np.ndarray] | None:
        """NAME.npz's arrays; where a run directory has only NAME.parquet, the same arrays
        from it; None when it has neither."""
        path = self.path / f"{name}.npz"
        if not path.is_file():
            if not (self.path / f"{name}.parquet").is_file():
                return None
            from aifabric.fabric import columnar

            arrays = getattr(columnar, f"{name}_arrays")
            return arrays(self.table(name), self.path / f"{name}.parquet")
        try:
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        except (OSError, ValueError) as e:
            raise AifabricError(f"{path} cannot be read: {e}") from None

    def flows(self) -> dict[str, np.ndarray] | None:
        return self._arrays("flows")

    def ports(self) -> dict[str, np.ndarray] | None:
        return self._arrays("ports")

    def collectives(self) -> dict[str, np.ndarray] | None:
        return self._arrays("collectives")

    def table(self, name: str, columns: list[str] | None = None):
        """NAME.parquet (flows, ports or collectives) as a pyarrow Table; a missing or broken
        file is one sentence."""
        from aifabric.fabric.columnar import read_parquet

        if name not in TABLES:
            raise ValueError(f"a run directory's tables are {', '.join(TABLES)}, not {name!r}")
        path = self.path / f"{name}.parquet"
        if not path.is_file():
            raise AifabricError(f"{self.path} has no {name}.parquet")
        return read_parquet(path, columns)

    def captures(self) -> list[Path]:
        return sorted((self.path / "captures").glob("*.pcap*"))


def remove_run_dir(path: str | Path) -> None:
    """Delete a run directory so it can be written again (`run --force`, a sweep's rerun).

    Only a directory with a run.json, or an empty one, is removed: a mistyped
    `-o ~` must not delete a home directory.
    """
    import shutil

    path = Path(path)
    if not path.exists():
        return
    if not path.is_dir():
        raise AifabricError(f"{path} is not a directory")
    if any(path.iterdir()) and not (path / "run.json").is_file():
        raise AifabricError(f"{path} is not a run directory (no run.json); not replacing it")
    shutil.rmtree(path)
