"""The run directory: what every engine writes and the analyzer reads.

One run = one scenario on one engine. Files, each written atomically (a
temporary file renamed into place, so a reader never sees half of one):

    run.json         schema, engine, status, scenario, versions, times, message
    topology.json    aifabric.fabric.export.topology_json(fabric)
    flows.npz        per flow (one QP's transfer): flow_id job op step channel src dst
                     sqpn dqpn sport bytes start_ns end_ns (end_ns -1: unfinished; where
                     it is measured: run.json features.finish),
                     path_ptr int64[n + 1] and path_link: the links flow f used are
                     path_link[path_ptr[f]:path_ptr[f + 1]], in order;
                     optional: route_epoch, which routing chose flow f's route (0 the
                     one at the start, k the one after the run's k-th fault during
                     the run; the simulator writes it), delivered_bytes (the payload
                     bytes its receiver has; the simulator writes it)
    ports.npz        per-port time series at a fixed interval, kept where they carry
                     something (aifabric.fabric.portseries): interval_ns; t_ns[s] (start
                     of sample s); port[p] (the port ids recorded, see
                     aifabric.fabric.model); scale (emulation rate factor, 1 in sim);
                     entries, the (sample, port) cells in which anything happened (a
                     cell without one is 0 throughout), in (sample, port) order:
                     sample_index[e], port_index[e] (a position in port), and each
                     entry's tx_bytes, qdepth_max_bytes, qdepth_mean_bytes,
                     ecn_marked, paused_ns, pfc_sent, drops; optional
                     (OPTIONAL_PORT_SERIES, where the engine counts it): cnp_sent, the
                     CNPs a NIC sent, on the NIC's own port, in the sample its receiver
                     generated them (the simulator writes it, summing to run.json's
                     cnp_sent; the emulator's switch monitor does not see its hosts'
                     CNPs and leaves it out). The entries are deflated and in the
                     narrowest integer type that holds their values (Run.ports() widens
                     them to int64); runs written before that hold int64 arrays
                     uncompressed. Runs written before entries hold each
                     series as a dense [samples, ports] array; Run.ports() reads both
    collectives.npz  per collective op: op job kind algorithm bytes ranks start_ns
                     end_ns algbw_bps busbw_bps (nccl-tests convention); busbw_factor
                     (busbw / algbw, recorded also for ops that did not finish; runs
                     written before it was recorded lack it); protocol and
                     predicted_ns (the NCCL protocol and cost-model time of the op,
                     aifabric.traffic.nccl; "" and 0 for patterns; older runs lack them);
                     ready_ns, iteration_start_ns, compute_ns (when the compute the op
                     waited for was done, its job's start and compute-only iteration
                     time; 0 compute for a job with none; older runs lack them:
                     aifabric.fabric.completion.iterations)
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
    ports.parquet        one row per entry of ports.npz (long form; each port's rows
                         together, in time order): t_ns, port, port_name,
                         node_name and peer_name (the port's node and the node it sends
                         to), node_role and peer_role (nic, rtsw, ctsw, atsw),
                         interval_ns, then every series of ports.npz (tx_bytes ...
                         drops, cnp_sent where recorded); key-value metadata `aifabric`
                         (JSON): interval_ns, scale, the recorded ports, every sample's
                         t_ns, the arrays' dtypes
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

import contextlib
import fcntl
import json
import os
import platform
import socket
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from aifabric.fabric.completion import SIZE_IN_ALL  # noqa: F401 (the run directory's term)
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.files import is_temporary, replace_atomic, why_not_written

RUN_SCHEMA = "aifabric.run/1"
STATUSES = ("running", "complete", "partial", "failed")
KILLED = "killed"  # what readers make of "running" when no process holds the run's lock
LOCK = "run.lock"
LOCK_BYTES = 512  # the lock file's size from the start: room for a final status (`finish`)
RESERVE = ".run.reserve"
RESERVE_BYTES = 64 * 1024
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


def write_json(path: Path, data: Any) -> None:
    def w(tmp):
        with open(tmp, "w") as fh:
            json.dump(data, fh, indent=1, default=jsonable)
            fh.write("\n")

    replace_atomic(path, w)


# zlib's level for deflated .npz files (np.savez_compressed takes zlib's default, 6): on
# the port series of bench_htsim's incast, 3 times faster (9 against 29 ms of CPU) for 10%
# more bytes (146 against 133 kB); 14% more on the demo's
NPZ_LEVEL = 4


def savez_deflated(file, **arrays) -> None:
    """np.savez_compressed(file, **arrays) at zlib level NPZ_LEVEL: the same members, each
    array's .npy deflated; np.load reads either."""
    with zipfile.ZipFile(
        file, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=NPZ_LEVEL, allowZip64=True
    ) as zf:
        for name, value in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value))


def write_npz(path: Path, arrays: dict[str, Any], *, compress: bool = False) -> None:
    save = savez_deflated if compress else np.savez

    def w(tmp):
        with open(tmp, "wb") as fh:
            save(fh, **arrays)

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
    a run in progress from one whose process died (`effective_status`). Beside
    it, `.run.reserve` holds room for the last run.json: a disk that fills
    during the run still takes the final status (the reserve is freed to write
    it), and should even that fail, the lock file (its bytes already on disk)
    records the status in place, which readers take over run.json's "running".
    A directory it could not finish making (a full disk) is removed again.
    """

    def __init__(
        self,
        path: str | Path,
        engine: str,
        scenario: dict[str, Any],
        features: dict[str, Any] | None = None,
        owner: str | None = None,
    ):
        self.path = Path(path)
        check_run_dir(self.path)
        made = not self.path.exists()
        self._lock = None
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
        if owner is not None:
            self.meta["owner"] = owner
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            fcntl.flock(self._lock, fcntl.LOCK_EX)
            stamp = f"{os.getpid()}\n{owner or ''}\n".encode()
            os.write(self._lock, stamp.ljust(LOCK_BYTES, b" "))
            os.fsync(self._lock)
            (self.path / "captures").mkdir(exist_ok=True)
            self._write_meta()
            self._reserve()
        except (OSError, AifabricError) as e:
            why = why_not_written(self.path / LOCK, e) if isinstance(e, OSError) else str(e)
            self._abandon(made)
            if isinstance(e, AifabricError):
                raise
            raise AifabricError(f"cannot write run directory {self.path}: {why}") from None
        except BaseException:
            self._abandon(made)
            raise

    def _abandon(self, made: bool) -> None:
        """Undo a run directory that could not be set up (what this writer made of it)."""
        import shutil

        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
        if made:
            shutil.rmtree(self.path, ignore_errors=True)
        else:
            for name in (LOCK, RESERVE, "run.json"):
                (self.path / name).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                (self.path / "captures").rmdir()

    def _reserve(self) -> None:
        size = RESERVE_BYTES + 4 * (self.path / "run.json").stat().st_size
        fd = os.open(self.path / RESERVE, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)

    def _write_meta(self) -> None:
        write_json(self.path / "run.json", self.meta)

    def topology(self, fabric) -> None:
        from aifabric.fabric.export import topology_json
        from aifabric.fabric.files import write_atomic

        write_atomic(self.path / "topology.json", topology_json(fabric))
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
        """ports.npz and ports.parquet from the series: dense ([samples, ports] each) or
        entries (`sample_index`, `port_index` and each series' values there; see
        aifabric.fabric.portseries). Either way only the entries are written."""
        from aifabric.fabric.portseries import ENTRY_KEYS, narrow, sparse

        entries = {k: series.pop(k) for k in ENTRY_KEYS if k in series}
        missing = [k for k in PORT_SERIES if k not in series]
        if missing:
            raise ValueError(f"port series lack {', '.join(missing)}")
        unknown = [k for k in series if k not in PORT_SERIES + OPTIONAL_PORT_SERIES]
        if unknown:
            raise ValueError(f"port series {', '.join(unknown)} are not in the run format")
        series = {**entries, **series} if len(entries) == len(ENTRY_KEYS) else sparse(series)
        from aifabric.fabric.columnar import ports_tables, write_parquet

        # the entries in the narrowest integer type that holds them, deflated: mostly
        # zeros and small counts, so 50 times smaller at cluster scale (1.13 GB -> 21 MB for
        # cluster-24k's ring); readers widen them again (PortSamples)
        write_npz(
            self.path / "ports.npz",
            {"interval_ns": interval_ns, "t_ns": t_ns, "port": port, "scale": scale,
             **{k: narrow(v) for k, v in series.items()}},
            compress=True,
        )  # fmt: skip
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
        """The final status, written last; on a full disk, written into the
        reserve's room, else into the lock file in place (see the class)."""
        if status not in STATUSES[1:]:
            raise ValueError(f"a run ends complete, partial or failed, not {status!r}")
        self.meta["status"] = status
        self.meta["message"] = message
        self.meta["wall_time_s"] = round(time.time() - self._started, 3)
        try:
            self._write_meta()
        except AifabricError:
            (self.path / RESERVE).unlink(missing_ok=True)
            try:
                self._write_meta()
            except AifabricError as e:
                if self._lock is None:
                    raise
                ended = f"{status}: {message}" if message else status
                self._status_in_lock("failed", f"{e} (the run had ended {ended})")
                os.close(self._lock)
                self._lock = None
                raise AifabricError(f"{e}; {self.path / LOCK} records the run as failed") from None
        (self.path / RESERVE).unlink(missing_ok=True)
        if self._lock is not None:
            (self.path / LOCK).unlink(missing_ok=True)
            os.close(self._lock)
            self._lock = None

    def _status_in_lock(self, status: str, message: str) -> None:
        record = json.dumps({"status": status, "message": message[:300]}).encode()
        os.pwrite(self._lock, record[: LOCK_BYTES - 1].ljust(LOCK_BYTES - 1) + b"\n", 0)


def _lock_held(path: Path, meta: dict) -> bool:
    """Whether a live process holds the run's lock (for runs without one: its pid lives)."""
    held = _held(path / LOCK)
    if held is not None or meta.get("status") != "running":
        return bool(held)
    pid, host = meta.get("pid"), meta.get("host")
    if not isinstance(pid, int) or host != socket.gethostname():
        return True  # nothing to tell by: take run.json's word
    return Path(f"/proc/{pid}").exists()


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
    return bool(_held(path))


def _held(path: str | Path) -> bool | None:
    """Whether a process holds the lock file `path`; None when there is no such file (one
    look, so that a lock removed meanwhile is never read as both absent and free)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
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
        meta = read_meta(path)
    status = meta.get("status")
    if status == "running" and not _lock_held(path, meta):
        record = lock_record(path)
        return record["status"] if record else KILLED
    return status


def lock_record(path: str | Path) -> dict | None:
    """The final status a run wrote into its lock file when run.json could not take it (a
    full disk: `RunWriter.finish`), or None."""
    try:
        with open(Path(path) / LOCK, "rb") as fh:
            text = fh.read(LOCK_BYTES)
        record = json.loads(text)
    except (OSError, ValueError):
        return None
    if (
        isinstance(record, dict)
        and record.get("status") in STATUSES[1:]
        and isinstance(record.get("message"), str)
    ):
        return record
    return None


class Run:
    """A run directory opened for reading; arrays load lazily.

    Every file is checked as it loads (`load_npz` and the checks below): a file that is
    missing, truncated, not what its name says, or that disagrees with the others (a flow
    on a link topology.json does not have, a series of the wrong shape) is one sentence
    naming the file and what is wrong with it (`AifabricError`), never a traceback.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fabric = None
        meta = self.path / "run.json"
        if not meta.is_file():
            raise AifabricError(f"{self.path} is not a run directory (no run.json)")
        self.meta = read_meta(self.path)
        status = effective_status(self.path, self.meta)
        if status != self.meta["status"] and status != KILLED:
            self.meta.update(lock_record(self.path) or {})
        elif status == KILLED:
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

    def _missing(self, name: str) -> AifabricError:
        why = f" (the run is {self.status}: {self.meta['message']})" if self.meta["message"] else ""
        return AifabricError(f"{self.path / name} is missing{why}")

    def topology(self) -> dict:
        """topology.json, checked: it must describe a fabric (`fabric_from_topology`)."""
        self.fabric()
        return self._topology

    def fabric(self):
        """The fabric topology.json describes (read once)."""
        if self._fabric is None:
            from aifabric.fabric.export import fabric_from_topology

            path = self.path / "topology.json"
            if not path.is_file():
                raise self._missing("topology.json")
            topo = _read_json(path)
            if not isinstance(topo, dict):
                raise AifabricError(f"{path} is not a topology: it holds no JSON object")
            try:
                fabric = fabric_from_topology(topo)
            except AifabricError as e:
                raise AifabricError(f"{path} is not a fabric: {_after_colon(e)}") from None
            self._topology, self._fabric = topo, fabric
        return self._fabric

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
        return load_npz(path)

    def _checked(self, name: str, check) -> dict[str, np.ndarray] | None:
        z = self._arrays(name)
        if z is not None:
            where = self.path / f"{name}.npz"
            check(where if where.is_file() else self.path / f"{name}.parquet", z)
        return z

    def _known_fabric(self):
        """The fabric to check arrays against; None for a run that wrote no topology.json
        (whatever needs the fabric then says that it is missing)."""
        return self.fabric() if (self.path / "topology.json").is_file() else None

    def flows(self) -> dict[str, np.ndarray] | None:
        return self._checked(
            "flows", lambda p, z: _check_flows(p, z, self._known_fabric(), self.meta)
        )

    def ports(self):
        """The port series (aifabric.fabric.portseries.PortSamples), or None."""
        from aifabric.fabric.portseries import PortSamples

        z = self._checked("ports", lambda p, z: _check_ports(p, z, self._known_fabric()))
        return None if z is None else PortSamples.from_arrays(z)

    def collectives(self) -> dict[str, np.ndarray] | None:
        return self._checked("collectives", _check_collectives)

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


def _after_colon(e: Exception) -> str:
    text = str(e)
    return text.split(": ", 1)[1] if ": " in text else text


def _read_json(path: Path):
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else f"not JSON ({e})"
        raise AifabricError(f"{path} cannot be read: {why}") from None


_META_TYPES = {
    "engine": (str,),
    "status": (str,),
    "message": (str,),
    "scenario": (dict,),
    "features": (dict,),
    "results": (dict,),
    "pid": (int, type(None)),
    "host": (str, type(None)),
    "wall_time_s": (int, float, type(None)),
}


def read_meta(path: str | Path) -> dict:
    """A run directory's run.json, checked: an object of the run schema whose fields have
    their types and whose status is one a run records."""
    where = Path(path) / "run.json"
    meta = _read_json(where)
    if not isinstance(meta, dict):
        raise AifabricError(f"{where} is not a run record: it holds no JSON object")
    if meta.get("schema") != RUN_SCHEMA:
        raise AifabricError(f"{where} is not an {RUN_SCHEMA} run record")
    for key, types in _META_TYPES.items():
        if key in ("engine", "status") and key not in meta:
            raise AifabricError(f"{where} has no {key}")
        if key in meta and (not isinstance(meta[key], types) or isinstance(meta[key], bool)):
            raise AifabricError(f"{where}: {key} is {type(meta[key]).__name__}, not as recorded")
    if meta["status"] not in STATUSES:
        raise AifabricError(
            f"{where}: status {meta['status'][:40]!r} is not one of {', '.join(STATUSES)}"
        )
    meta.setdefault("message", "")
    meta.setdefault("scenario", {})
    meta.setdefault("results", {})
    return meta


MAX_VALUE = 2**53  # of any count, time or size in a run's arrays: 104 days in ns, 9 PB
MAX_BUSBW_FACTOR = 64  # nccl-tests' factors are at most 2 (all-reduce's 2(n-1)/n)
MAX_NPZ_MEMBER_BYTES = 1 << 36  # 64 GiB: more than any run writes; a header claiming more lies


def load_npz(path: Path) -> dict[str, np.ndarray]:
    """An .npz of a run directory, every array read; one sentence when it is truncated, not
    a zip of .npy arrays, holds objects, or an array's header claims more than it holds."""
    import zipfile

    out = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                key = info.filename.removesuffix(".npy")
                with zf.open(info) as fh:
                    version = np.lib.format.read_magic(fh)
                    if version == (1, 0):
                        shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
                    elif version == (2, 0):
                        shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
                    else:
                        raise ValueError(f"array {key} has an .npy version {version} not written")
                    if dtype.hasobject:
                        raise ValueError(f"array {key} holds Python objects")
                    need = int(np.prod(shape, dtype=object)) * dtype.itemsize
                    if need > MAX_NPZ_MEMBER_BYTES or need > info.file_size:
                        raise ValueError(
                            f"array {key}'s header claims {need:,} bytes and the file holds "
                            f"{info.file_size:,}"
                        )
                with zf.open(info) as fh:
                    out[key] = np.lib.format.read_array(fh, allow_pickle=False)
    except AifabricError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever a damaged zip or header raises
        raise AifabricError(f"{path} cannot be read: {_npz_problem(e)}") from None
    return out


def _npz_problem(e: Exception) -> str:
    import zipfile

    if isinstance(e, zipfile.BadZipFile):
        return f"it is truncated or not an npz archive ({e})"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = " ".join(str(e).split())[:200]
    return text or type(e).__name__


def _column(path, z, key, *, ndim=1, kind="i", length=None):
    """z[key], checked: present, of `ndim` dimensions and dtype kind `kind` ("i" integers,
    "n" numbers, "U" text), `length` long (or shaped) when given."""
    if key not in z:
        raise AifabricError(f"{path} has no {key}")
    a = z[key]
    if a.ndim != ndim:
        raise AifabricError(f"{path}: {key} has {a.ndim} dimensions, not {ndim}")
    ok = {
        "i": a.dtype.kind in "iu",
        "n": a.dtype.kind in "iuf",
        "U": a.dtype.kind in "U",
    }[kind]
    if not ok:
        what = {"i": "integers", "n": "numbers", "U": "text"}[kind]
        raise AifabricError(f"{path}: {key} holds {a.dtype}, not {what}")
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        raise AifabricError(f"{path}: {key} holds NaN or infinite values")
    if a.size and a.dtype.kind in "iuf" and np.abs(a.astype(np.float64)).max() > MAX_VALUE:
        raise AifabricError(f"{path}: {key} holds a value beyond 2**53, more than any run makes")
    if length is not None:
        shape = length if isinstance(length, tuple) else (length,)
        if a.shape != shape:
            raise AifabricError(f"{path}: {key} has shape {a.shape}, not {shape}")
    return a


def _within(path, key, a, lo, hi, what):
    if a.size and (a.min() < lo or a.max() >= hi):
        bad = a[(a < lo) | (a >= hi)][0]
        raise AifabricError(f"{path}: {key} holds {int(bad)}, {what}")


def _check_flows(path: Path, z: dict, fabric, meta: dict) -> None:
    n = len(_column(path, z, "flow_id"))
    for key in FLOW_FIELDS:
        if key not in ("path_ptr", "path_link"):
            _column(path, z, key, length=n)
    ptr = _column(path, z, "path_ptr", length=n + 1)
    link = _column(path, z, "path_link")
    if ptr[0] != 0 or np.any(np.diff(ptr) < 0) or ptr[-1] != len(link):
        raise AifabricError(
            f"{path}: path_ptr does not index path_link (from 0, rising, to {len(link)})"
        )
    if fabric is not None:
        links = f"and the fabric has {fabric.n_links} links"
        _within(path, "path_link", link, 0, fabric.n_links, links)
        nic = fabric.nic_port >= 0
        for key in ("src", "dst"):
            a = z[key]
            nodes = f"and the fabric has {fabric.n_nodes} nodes"
            _within(path, key, a, 0, fabric.n_nodes, nodes)
            if a.size and not nic[a].all():
                raise AifabricError(f"{path}: {key} names a switch, not a NIC")
        looped = np.flatnonzero(z["src"] == z["dst"])
        if looped.size:  # no engine sends a NIC's bytes to itself over the fabric
            raise AifabricError(f"{path}: flow {int(looped[0])} runs from a NIC to itself")
        _check_paths(path, z["src"], z["dst"], ptr, link, fabric)
    for key in ("job", "op", "bytes"):
        _within(path, key, z[key], 0, np.iinfo(np.int64).max, "a negative value")
    for key in ("start_ns", "end_ns"):
        _within(path, key, z[key], -1, np.iinfo(np.int64).max, "below -1 (not started)")
    if "route_epoch" in z:
        faults = meta["scenario"].get("faults")
        later = sum(
            1 for f in faults if isinstance(f, dict) and f.get("at_ns", 0) != 0
        ) if isinstance(faults, list) else 0  # fmt: skip
        epoch = _column(path, z, "route_epoch", length=n)
        _within(path, "route_epoch", epoch, 0, later + 1, f"and the run has {later} faults")


def _check_paths(path, src, dst, ptr, link, fabric) -> None:
    """Each routed flow's links start at its src's link and reach its dst (in order for a
    routed path; a sprayed flow records every link it used)."""
    length = np.diff(ptr)
    routed = np.flatnonzero(length > 0)
    if not routed.size:
        return
    a, b = fabric.link_a.astype(np.int64), fabric.link_b.astype(np.int64)
    first = link[ptr[routed]].astype(np.int64)
    off = (a[first] != src[routed]) & (b[first] != src[routed])
    if off.any():
        raise AifabricError(f"{path}: flow {int(routed[off][0])}'s path does not start at its src")
    owner = np.repeat(np.arange(len(src)), length)
    nic = fabric.nic_port >= 0
    ends = (src[owner], dst[owner])
    for x in (a[link], b[link]):  # a path passes through switches only
        astray = nic[x] & (x != ends[0]) & (x != ends[1])
        if astray.any():
            f = int(owner[astray][0])
            raise AifabricError(
                f"{path}: flow {f}'s path passes through {fabric.node_name[x[astray][0]]}, "
                "a NIC that is neither its src nor its dst"
            )
    touches = (a[link] == dst[owner]) | (b[link] == dst[owner])
    reached = np.zeros(len(src), dtype=bool)
    reached[owner[touches]] = True
    if not reached[routed].all():
        f = int(routed[~reached[routed]][0])
        raise AifabricError(f"{path}: flow {f}'s path never reaches its dst")


def _scalar(path, z, key, kind):
    if key not in z:
        raise AifabricError(f"{path} has no {key}")
    a = z[key]
    if a.shape != () or a.dtype.kind not in kind:
        raise AifabricError(f"{path}: {key} is not one number")
    value = a.item()
    if not np.isfinite(value) or not 0 < value <= MAX_VALUE:
        raise AifabricError(f"{path}: {key} is {value}, not above 0 (and below 2**53)")
    return value


def _check_ports(path: Path, z: dict, fabric) -> None:
    _scalar(path, z, "interval_ns", "iu")
    if "scale" in z:
        _scalar(path, z, "scale", "iuf")
    t_ns = _column(path, z, "t_ns")
    samples = len(t_ns)
    if np.any(t_ns < 0) or np.any(np.diff(t_ns) < 0):
        raise AifabricError(f"{path}: t_ns is not a rising series of times")
    if (samples + 1) * int(z["interval_ns"]) > MAX_VALUE:
        interval = int(z["interval_ns"])
        raise AifabricError(f"{path}: {samples} samples of {interval} ns last beyond 2**53 ns")
    port = _column(path, z, "port")
    if fabric is not None:
        ports = f"and the fabric has {fabric.n_ports} ports"
        _within(path, "port", port, 0, fabric.n_ports, ports)
    if len(np.unique(port)) != len(port):
        raise AifabricError(f"{path}: port names a port twice")
    present = PORT_SERIES + tuple(k for k in OPTIONAL_PORT_SERIES if k in z)
    if "sample_index" not in z:  # dense, as runs before entries wrote it
        for key in present:
            a = _column(path, z, key, ndim=2, kind="n", length=(samples, len(port)))
            if a.size and a.min() < 0:
                raise AifabricError(f"{path}: {key} holds a negative value")
        return
    s = _column(path, z, "sample_index")
    n = len(s)
    j = _column(path, z, "port_index", length=n)
    _within(path, "sample_index", s, 0, samples, f"and it has {samples} samples")
    _within(path, "port_index", j, 0, len(port), f"and it records {len(port)} ports")
    cell = s.astype(np.int64) * max(len(port), 1) + j
    if n and np.any(np.diff(cell) <= 0):
        raise AifabricError(f"{path}: its entries are not in (sample, port) order, once each")
    for key in present:
        a = _column(path, z, key, kind="n", length=n)
        if a.size and a.min() < 0:
            raise AifabricError(f"{path}: {key} holds a negative value")


def _check_collectives(path: Path, z: dict) -> None:
    n = len(_column(path, z, "op"))
    for key in COLLECTIVE_FIELDS:
        kind = (
            "U" if key in ("kind", "algorithm") else "i" if key in ("op", "job", "ranks") else "n"
        )
        _column(path, z, key, kind=kind, length=n)
    if "busbw_factor" in z:
        factor = _column(path, z, "busbw_factor", kind="n", length=n)
        if factor.size and (factor.min() < 0 or factor.max() > MAX_BUSBW_FACTOR):
            raise AifabricError(
                f"{path}: busbw_factor holds {factor.max()}, beyond 0..{MAX_BUSBW_FACTOR}"
            )
    if "protocol" in z:
        _column(path, z, "protocol", kind="U", length=n)
    if "predicted_ns" in z:
        _column(path, z, "predicted_ns", kind="i", length=n)
        _within(
            path, "predicted_ns", z["predicted_ns"], 0, np.iinfo(np.int64).max, "a negative value"
        )
    for key in ("ready_ns", "iteration_start_ns", "compute_ns"):
        if key in z:
            _column(path, z, key, kind="i", length=n)
    for key in ("op", "job", "ranks", "bytes", "ready_ns", "iteration_start_ns", "compute_ns"):
        if key in z:
            _within(path, key, z[key], 0, np.iinfo(np.int64).max, "a negative value")


def recorded_owner(path: str | Path) -> str | None:
    """Which attempt made the run directory (`RunWriter`'s `owner`, a sweep's task key):
    run.json's word, or its lock file's (written first, so a process killed before run.json
    still says whose the directory is)."""
    path = Path(path)
    try:
        meta = json.loads((path / "run.json").read_bytes())
        if isinstance(meta, dict) and isinstance(meta.get("owner"), str):
            return meta["owner"]
    except (OSError, ValueError):
        pass
    try:
        lines = (path / LOCK).read_bytes()[:LOCK_BYTES].decode().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    owner = lines[1].strip() if len(lines) > 1 else ""
    return owner or None


def remove_own_attempt(path: str | Path, owner: str | None) -> None:
    """Remove what an earlier attempt of the same task (`owner`) left at `path`, a worker that
    died under it, so that the retry can write the run; a directory of anyone else stays."""
    import shutil

    path = Path(path)
    if owner is None or not path.is_dir() or recorded_owner(path) != owner:
        return
    if _lock_held(path, {}):
        raise AifabricError(f"{path} is being written by another attempt of this point")
    shutil.rmtree(path)


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
    if not (path / "run.json").is_file() and not _only_a_start(path):
        raise AifabricError(f"{path} is not a run directory (no run.json); not replacing it")
    shutil.rmtree(path)


def _only_a_start(path: Path) -> bool:
    """Whether `path` holds only what a run makes before its run.json (a process killed
    then): its lock, its reserve, an empty captures/, temporaries."""
    for p in path.iterdir():
        if p.name == "captures" and p.is_dir() and not any(p.iterdir()):
            continue
        if p.name not in (LOCK, RESERVE) and not is_temporary(p.name):
            return False
    return True


def record_failure(
    path: str | Path,
    engine: str,
    message: str,
    *,
    scenario: dict[str, Any] | None = None,
    owner: str | None = None,
    wall_time_s: float | None = None,
) -> bool:
    """Record at `path` a run that failed before its engine made (or finished) the
    directory: a run.json alone, status "failed", `message` saying why (a sweep's point
    whose scenario does not load or fit, whose worker died under it). Written into a
    directory that does not exist, or one that only the attempt `owner` made (or only a
    start: a lock, a reserve, temporaries) and no live process writes, whose leftovers it
    replaces; anyone else's directory stays as it is. Whether it wrote."""
    import shutil

    path = Path(path)
    if path.exists():
        if not path.is_dir() or _lock_held(path, {}):
            return False
        mine = owner is not None and recorded_owner(path) == owner
        if not mine and not _only_a_start(path):
            return False
        shutil.rmtree(path)
    meta = {
        "schema": RUN_SCHEMA,
        "engine": engine,
        "status": "failed",
        "scenario": scenario or {},
        "features": {},
        "versions": versions(),
        "pid": None,
        "host": None,
        "started_at": None,
        "wall_time_s": wall_time_s,
        "message": message,
        "results": {},
    }
    if owner is not None:
        meta["owner"] = owner
    try:
        path.mkdir(parents=True, exist_ok=True)
        write_json(path / "run.json", meta)
    except (OSError, AifabricError):
        return False
    return True
