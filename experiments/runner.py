"""Running a sweep: every point a Dask task that writes an ordinary run directory.

    DIR/sweep.json     the sweep as run: base scenario, keys, seeds, report settings
    DIR/results.csv    one row per finished run (RESULT_COLUMNS, the varied keys, metrics)
    DIR/results.parquet           the same, typed
    DIR/results_long.parquet      one row per run, job and metric (experiments/results_table.py)
    DIR/runs/NAME/     each point's run directory (aifabric.fabric.rundir)
    DIR/sweep.lock     locked by the process running the sweep, removed when it ends
                       (`aifabric watch` tells a sweep in progress from a stopped one by it)

Points run on a Dask `LocalCluster` (one single-threaded worker process per
core unless told otherwise) or on an existing cluster by its scheduler's
address; workers write the run directories (shared storage for a cluster of
machines) and return the point's metrics; the client builds the table and
rewrites it atomically after every point, so an interrupted sweep leaves a
table that agrees with its run directories. Run again, a sweep skips every
point whose run directory is complete and records the same scenario (its
hash), and runs the rest. Run again with another grid (or other seeds), the table keeps the
points the earlier grid made beside the new ones; a different sweep (base scenario, fixed
settings, varied keys or engine) in a folder that holds points is refused in one sentence.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aifabric.experiments.spec import Point, Sweep
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.files import remove_left_temporaries

SWEEP_LOCK = "sweep.lock"
RESULT_COLUMNS = ("point", "run_dir", "seed", "status", "error", "scenario_hash", "wall_s")


def scenario_hash(scenario_dict: dict) -> str:
    """A digest of what run.json records as the scenario (JSON, keys sorted), but for the
    simulator's partitions, which change how fast a run goes, never its results."""
    from aifabric.fabric.rundir import jsonable

    same = {k: v for k, v in scenario_dict.items() if k != "simulator"}
    text = json.dumps(same, sort_keys=True, default=jsonable, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _run_engine(engine: str, scenario, path: Path, owner: str | None = None) -> dict:
    """Run `scenario` into a new run directory at `path`; the engine's summary."""
    from aifabric.engines import run_scenario

    return run_scenario(engine, scenario, path, owner=owner)


def run_point(
    base: str, overrides, seed: int, path: str, engine: str, groups, owner: str | None = None
) -> dict:
    """One point, on a worker: load, run, measure. Errors become a failed row, not a raise,
    and a failed run.json in the point's directory (`record_failure`) where the engine left
    none: the results table is read from the run directories (`RunRows`), a failure too.

    `owner` (the task's key) is recorded in the run directory: when Dask runs the task
    again after its worker died, the retry replaces what that attempt left half written.
    The row's `run_json` is run.json's (inode, size, mtime) its metrics were read from."""
    from aifabric.experiments.columns import point_metrics
    from aifabric.fabric.rundir import record_failure, remove_own_attempt
    from aifabric.scenarios import load_scenario

    started = time.monotonic()
    row: dict[str, Any] = {}
    recorded = None
    try:
        sc = load_scenario(base, seed=seed, overrides=list(overrides))
        if sc.partitions == "auto":  # a sweep's workers share the machine's cores already
            sc = dataclasses.replace(sc, partitions=1)
        recorded = sc.to_dict()
        row["scenario_hash"] = scenario_hash(recorded)
        remove_own_attempt(path, owner)
        summary = _run_engine(engine, sc, Path(path), owner)
        row["status"] = summary.get("status", "complete")
        row["run_json"] = stat_key(Path(path) / "run.json")
        row.update(point_metrics(path, sc, groups))
    except Exception as e:
        message = str(e) if isinstance(e, AifabricError) else f"{type(e).__name__}: {e}"
        row.update(status="failed", error=message)
        row.pop("run_json", None)
        if not _finished_by(Path(path), owner):
            record_failure(path, engine, message, scenario=recorded, owner=owner,
                           wall_time_s=round(time.monotonic() - started, 3))  # fmt: skip
    row["wall_s"] = round(time.monotonic() - started, 3)
    return row


def _finished_by(path: Path, owner: str | None) -> bool:
    """Whether the run directory `path` is `owner`'s and its run.json a finished run's (the
    engine recorded its own failure)."""
    from aifabric.fabric.rundir import read_meta, recorded_owner

    if owner is None or recorded_owner(path) != owner:
        return False
    try:
        return read_meta(path)["status"] != "running"
    except AifabricError:
        return False


def stat_key(path: Path) -> tuple[int, int, int] | None:
    """(inode, size, mtime in ns) of `path`, None where there is no such file: what
    tells a rewritten run.json from the one a row was read from."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class RunRows:
    """The results-table row of each point, read from its run directory `out`/runs/NAME
    alone: status (the run's, `killed` for a process that died), error (run.json's
    message where the run is not complete), scenario_hash (of the scenario run.json
    records), wall_s (run.json's wall_time_s) and the metrics (`point_metrics`, for a
    complete or partial run). A run still running has no row.

    Rows are kept keyed by run.json's (inode, size, mtime): every write of a run.json is a
    new file renamed into place, so a row is read again exactly when its run.json changed,
    and a table rebuilt after every point costs a stat per point."""

    def __init__(self, out: str | Path, groups):
        self.runs = Path(out) / "runs"
        self.groups = tuple(groups)
        self._rows: dict[str, tuple[tuple, dict]] = {}

    def row(self, name: str) -> dict | None:
        """The row of the run directory runs/`name`, None where it has no run.json or
        its run is still running."""
        path = self.runs / name
        key = stat_key(path / "run.json")
        if key is None:
            self._rows.pop(name, None)
            return None
        kept = self._rows.get(name)
        if kept is not None and kept[0] == key:
            return dict(kept[1])
        row, final = _run_row(path, self.groups)
        if final:  # a status run.json says itself (not one inferred from a lock)
            self._rows[name] = (key, row)
        else:
            self._rows.pop(name, None)
        return None if row is None else dict(row)

    def offer(self, name: str, row: dict) -> None:
        """The metrics a worker measured of runs/`name` (`run_point`'s row), kept when the
        run.json it measured is the one there now, so the client need not read them again."""
        key = row.get("run_json")
        path = self.runs / name
        if key is None or tuple(key) != stat_key(path / "run.json"):
            return
        metrics = {k: v for k, v in row.items() if k not in (*RESULT_COLUMNS, "run_json")}
        made, final = _run_row(path, self.groups, metrics)
        if final and made is not None and made["status"] in ("complete", "partial"):
            self._rows[name] = (tuple(key), made)


def _run_row(path: Path, groups, metrics: dict | None = None) -> tuple[dict | None, bool]:
    """(row, whether run.json itself says the status) of the run directory `path`."""
    from types import SimpleNamespace

    from aifabric.experiments.columns import point_metrics
    from aifabric.fabric.rundir import Run

    try:
        run = Run(path)
    except AifabricError as e:  # run.json is damaged: a row that says so
        return {"status": "failed", "error": str(e)}, True
    if run.status == "running":
        return None, False
    meta = run.meta
    recorded = meta.get("scenario") or {}
    row: dict[str, Any] = {
        "status": run.status,
        "error": (meta.get("message") or None) if run.status != "complete" else None,
        "scenario_hash": scenario_hash(recorded) if recorded else None,
        "wall_s": meta.get("wall_time_s"),
    }
    if run.status in ("complete", "partial"):
        if metrics is None:
            workload = recorded.get("workload")
            scenario = SimpleNamespace(workload=workload if isinstance(workload, dict) else {})
            try:
                metrics = point_metrics(path, scenario, groups)
            except Exception as e:  # noqa: BLE001 - a damaged file is the row's error
                why = str(e) if isinstance(e, AifabricError) else f"{type(e).__name__}: {e}"
                row["error"] = f"its metrics cannot be read: {why}"
                metrics = {}
        row.update(metrics)
    return row, _recorded_status(path) == run.status


def _recorded_status(path: Path) -> str | None:
    from aifabric.fabric.rundir import read_meta

    try:
        return read_meta(path)["status"]
    except AifabricError:
        return None


@dataclass
class Progress:
    total: int
    reused: int
    done: int = 0
    failed: int = 0
    started: float = 0.0

    def line(self) -> str:
        finished = self.reused + self.done
        elapsed = time.monotonic() - self.started
        left = self.total - finished
        eta = ""
        if self.done and left:
            eta = f"  about {_duration(elapsed / self.done * left)} left"
        return (
            f"  {finished}/{self.total} points done  {self.failed} failed"
            f"  {_duration(elapsed)} elapsed{eta}"
        )


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


WORKER_BYTES = 400 * 2**20  # a local worker: Python, numpy, numba and a small point


def check_workers(workers: int) -> None:
    """One sentence when `workers` local processes would need more memory than is free."""
    from aifabric.fabric.memory import available_memory, check_memory

    free = available_memory() or 0
    check_memory(
        workers * WORKER_BYTES,
        f"--workers {workers:,} (at most --workers {max(free // WORKER_BYTES, 1):,} here)",
    )


def check_address(scheduler: str) -> None:
    """One sentence for a scheduler address that is not PROTOCOL://HOST:PORT."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(scheduler)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if parts is None or not parts.scheme or not parts.hostname or port is None:
        raise AifabricError(
            f"--scheduler {scheduler!r} is not a scheduler's address: write tcp://HOST:PORT"
        )


DASHBOARD = ":8787"  # Dask's usual port; a free one when another cluster has it
NO_BOKEH = "the Dask dashboard needs bokeh: pip install 'aifabric[sweep]'"
NO_DASHBOARD = "the Dask scheduler serves no dashboard"


def has_bokeh() -> bool:
    try:
        import bokeh  # noqa: F401
    except ImportError:
        return False
    return True


def dashboard(client) -> str:
    """One line on the cluster's dashboard: its address, or why there is none. The
    scheduler's HTTP server runs either way, its dashboard pages only where it can import
    bokeh and was not told to go without: the page itself says which."""
    import urllib.error
    import urllib.request

    def pages() -> bool:  # nested: sent by value, so a scheduler needs no aifabric for it
        try:
            import distributed.dashboard.scheduler  # noqa: F401 - what a scheduler serves it with
        except ImportError:
            return False
        return True

    try:
        http = "dashboard" in client.scheduler_info().get("services", {})
        link = client.dashboard_link if http else None
    except Exception:  # noqa: BLE001 - a scheduler that cannot answer serves no dashboard
        link = None
    if not link:
        return NO_DASHBOARD
    try:
        with urllib.request.urlopen(link, timeout=10):
            return f"Dask dashboard: {link}"
    except urllib.error.HTTPError:
        pass  # the server answers without the pages
    except (OSError, ValueError):
        return f"Dask dashboard (where the scheduler says; not reachable from here): {link}"
    try:
        return NO_BOKEH if not client.run_on_scheduler(pages) else NO_DASHBOARD
    except Exception:  # noqa: BLE001
        return NO_DASHBOARD


def connect(workers: int | None = None, scheduler: str | None = None):
    """(client, cluster): to `scheduler` if given (cluster None), else a new LocalCluster
    serving the Dask dashboard (where bokeh is installed)."""
    import warnings

    from dask.distributed import Client, LocalCluster

    if scheduler:
        check_address(scheduler)
        try:
            return Client(scheduler, timeout="10s"), None
        except (OSError, TimeoutError, ValueError, TypeError) as e:
            raise AifabricError(f"cannot reach the Dask scheduler at {scheduler}: {e}") from None
    # "port 8787 is in use ... on port N instead": the line printed says where it is
    with _workers_ignore_ctrl_c(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Port .* is already in use")
        cluster = LocalCluster(
            n_workers=workers or default_workers(),
            threads_per_worker=1,
            processes=True,
            dashboard_address=DASHBOARD if has_bokeh() else None,
            memory_limit=0,
            # CRITICAL: a point's failure reaches the table through its future; what the
            # workers log themselves is noise, e.g. a heartbeat that finds the scheduler
            # already closed while the cluster shuts down after Ctrl-C (a traceback at ERROR)
            silence_logs=logging.CRITICAL,
        )
    return Client(cluster), cluster


@contextlib.contextmanager
def _workers_ignore_ctrl_c():
    """SIGINT ignored while the local workers start, so they inherit that (an ignored signal
    stays ignored in a spawned process): Ctrl-C at a terminal reaches the whole process group,
    and the client alone should handle it, cancelling the points and closing the cluster;
    each worker would otherwise die with a traceback of its own."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _forked_workers():
    """Local workers forked from multiprocessing's forkserver while the sweep runs, not
    spawned: the forkserver starts with the first workers, ignoring SIGINT as they do
    (`_workers_ignore_ctrl_c`), and every worker forked from it inherits that, including
    one its nanny starts again after a worker's process died. A spawned one would take the
    client's SIGINT handling then and die with a traceback at the next Ctrl-C."""
    import dask
    import distributed  # noqa: F401 - its defaults first: leaving the `set` removes a new key

    with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
        yield


def run_sweep(
    sweep: Sweep,
    out: str | Path,
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    echo=None,
    wait: bool = False,
) -> dict:
    """Run every point not already done; returns counts and whether it was interrupted.
    `echo(text, keep=False)` is told how it goes, and `echo(progress)` the points so far
    (a `Progress`; `stderr_progress` draws it).

    The results tables are rebuilt from the run directories (`rebuild_tables`) at the
    start, after every point and at the end, so they always say what the directories
    say. Ctrl-C cancels what is queued or running and leaves the tables rebuilt (a second
    Ctrl-C meanwhile is said, not obeyed); the same call again resumes. One sweep at a
    time writes a folder (`sweep_lock`).
    """
    from aifabric.experiments.results_table import FILES, earlier_points

    out = Path(out)
    points = sweep.points()
    earlier = earlier_points(out, sweep, points)  # before sweep.json says what it was
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AifabricError(f"cannot write the sweep into {out}: {e.strerror}") from None
    try:
        with sweep_lock(out, wait=wait, echo=echo), _forked_workers(), _interrupts_kept():
            # a sweep killed outright while it wrote its tables left their temporaries
            remove_left_temporaries(out, (*FILES, "sweep.json"))
            return _run_sweep(sweep, out, points, earlier, workers, scheduler, echo)
    finally:
        getattr(echo, "close", lambda: None)()  # a progress bar gives the terminal back


LOCK_POLL_S = 0.5


@contextlib.contextmanager
def sweep_lock(out: Path, *, wait: bool = False, echo=None):
    """Hold `out`/sweep.lock while the sweep writes `out`: a second sweep of the same folder
    is refused in one sentence, or (`wait`) waits for the first to finish."""
    from aifabric.fabric.rundir import hold_lock, release_lock

    lock = out / SWEEP_LOCK
    said = False
    while True:
        holder = "?"
        with contextlib.suppress(OSError):
            holder = lock.read_text().strip() or "?"
        try:
            fd = hold_lock(lock, f"{out} is being written by another sweep (pid {holder}); "
                           "let it finish, or give --wait to start when it has")  # fmt: skip
            break
        except AifabricError:
            if not wait:
                raise
            if echo is not None and not said:
                echo(f"waiting for the sweep of pid {holder} to finish with {out} ...")
                said = True
            time.sleep(LOCK_POLL_S)
    try:
        yield
    finally:
        release_lock(lock, fd)


@contextlib.contextmanager
def _shielded(echo):
    """Signals while the sweep stops (cancelling, closing the cluster, writing the table) are
    said, not raised: a second Ctrl-C must not cut the table short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def said(signum, frame):
        if echo is not None:
            echo("already stopping: the table is being written, then the sweep ends")

    previous = {s: signal.signal(s, said) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


_swallowed = threading.Event()  # a Ctrl-C that Python dropped while the sweep ran


@contextlib.contextmanager
def _interrupts_kept():
    """A Ctrl-C (or SIGTERM) is a KeyboardInterrupt raised wherever the main thread is; when
    that is a finalizer or a garbage-collector callback (distributed has one), Python drops
    it with an "Exception ignored" traceback and the sweep would run on. While the sweep
    runs, such a dropped interrupt is kept instead, silently, and `_check_interrupt` raises
    it again where the sweep waits for its points."""
    _swallowed.clear()
    previous = sys.unraisablehook

    def keep(unraisable):
        if issubclass(unraisable.exc_type, KeyboardInterrupt):
            _swallowed.set()
        else:
            previous(unraisable)

    sys.unraisablehook = keep
    try:
        yield
    finally:
        sys.unraisablehook = previous
        _swallowed.clear()


def _check_interrupt() -> None:
    if _swallowed.is_set():
        _swallowed.clear()
        raise KeyboardInterrupt


WAIT_POLL_S = 0.1


def _completed(futures):
    """`futures` as they finish, stopping (KeyboardInterrupt) within WAIT_POLL_S of a dropped
    Ctrl-C however long the running points take."""
    from dask.distributed import as_completed

    pending = as_completed(futures)
    while not pending.is_empty():
        _check_interrupt()
        batch = pending.next_batch(block=False)
        if not batch:
            time.sleep(WAIT_POLL_S)
        yield from batch


def _is_done(sweep: Sweep, p: Point, row: dict | None) -> bool:
    """Whether the point's run directory holds a complete run of its scenario as the sweep
    gives it now (the same hash)."""
    from aifabric.scenarios import load_scenario

    if row is None or row.get("status") != "complete":
        return False
    try:
        sc = load_scenario(sweep.scenario, seed=p.seed, overrides=list(p.overrides))
    except AifabricError:
        return False
    return row.get("scenario_hash") == scenario_hash(sc.to_dict())


FAILED = ("failed", "killed")  # the statuses a sweep counts as failed points


def _run_sweep(sweep: Sweep, out: Path, points, earlier, workers, scheduler, echo) -> dict:
    from aifabric.experiments.results_table import rebuild_tables
    from aifabric.fabric.rundir import record_failure, remove_run_dir, write_json

    table = out / "results.csv"
    runs = RunRows(out, sweep.metrics)
    progress = Progress(len(points), 0, started=time.monotonic())
    show = echo or (lambda text, keep=False: None)
    interrupted = False
    said_failed: set[int] = set()  # points whose run said failed (should no row say so)
    client = cluster = None
    futures = {}
    try:  # a Ctrl-C anywhere, the cluster's start too, leaves the tables rebuilt
        (out / "runs").mkdir(exist_ok=True)
        write_json(out / "sweep.json", {**sweep.to_dict(), "earlier": earlier})
        todo = [p for p in points if not _is_done(sweep, p, runs.row(p.name))]
        progress.reused = len(points) - len(todo)
        for p in todo:  # what an earlier attempt left is run again, not shown as this one's
            remove_run_dir(out / "runs" / p.name)
        rebuild_tables(out, runs=runs)
        show(
            f"{sweep.name}: {len(points)} points, {progress.reused} already done, "
            f"{len(todo)} to run",
            keep=True,
        )
        if todo:
            if scheduler is None:  # no more workers than points, and as many as memory holds
                workers = min(workers or default_workers(), len(todo))
                check_workers(workers)
            client, cluster = connect(workers, scheduler)
            show(dashboard(client), keep=True)
            for p in todo:
                path = str((out / "runs" / p.name).resolve())
                key = f"aifabric-point-{p.index}-{time.time_ns()}"
                fut = client.submit(
                    run_point, sweep.scenario, p.overrides, p.seed, path, sweep.engine,
                    sweep.metrics, key, key=key, pure=False,
                )  # fmt: skip
                futures[fut] = (p, path, key)
            show(progress)
            for fut in _completed(futures):
                p, path, key = futures[fut]
                try:
                    row = fut.result()
                except Exception as e:  # the worker died under it (KilledWorker), every try
                    row = {"status": "failed", "error": _lost(e)}
                    record_failure(path, sweep.engine, row["error"], owner=key)
                runs.offer(p.name, row)
                progress.done += 1
                if row.get("status") == "failed":
                    progress.failed += 1
                    said_failed.add(p.index)
                rebuild_tables(out, runs=runs)
                show(progress)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        with _shielded(echo):
            if client is not None:
                if interrupted:
                    client.cancel(list(futures))
                client.close()
            if cluster is not None:
                cluster.close()
            tables = {"rows": {}, "earlier": 0}  # interrupted before sweep.json was written
            if (out / "sweep.json").is_file():
                tables = rebuild_tables(out, runs=runs)  # what the directories say now
    rows = tables["rows"]
    failed = sum(
        rows[p.index]["status"] in FAILED if p.index in rows else p.index in said_failed
        for p in points
    )
    return {
        "points": len(points),
        "done": len(rows),
        "reused": progress.reused,
        "ran": progress.done,
        "failed": failed,
        "interrupted": interrupted,
        "results": str(table),
        "earlier": tables["earlier"],
    }


def _lost(e: Exception) -> str:
    """The error of a point whose task raised on the client rather than returning a row:
    Dask's KilledWorker says the point's worker died under it on every try."""
    from distributed import KilledWorker

    if isinstance(e, KilledWorker):
        return (
            f"its worker process died while running it, on each of {e.allowed_failures + 1} "
            "tries (killed, out of memory or crashed: Dask's KilledWorker, last on "
            f"{e.last_worker.address})"
        )
    return f"{type(e).__name__}: {e}"


def stderr_progress():
    """Progress on stderr: `show(text, keep=False)` prints a line (one shown with `keep`, the
    sweep's size or the dashboard's address, stays), `show(progress)` the points so far: a
    rich progress bar redrawn in place on a terminal, one line per update otherwise."""
    if not sys.stderr.isatty():

        def plain(item, keep: bool = False) -> None:
            sys.stderr.write((item.line() if isinstance(item, Progress) else item) + "\n")
            sys.stderr.flush()

        return plain

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.progress import Progress as Bar

    bar = Bar(
        TextColumn("  points"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn(), TimeRemainingColumn(),
        console=Console(stderr=True), transient=False,
    )  # fmt: skip
    task = None

    def show(item, keep: bool = False) -> None:
        nonlocal task
        if not isinstance(item, Progress):
            bar.console.print(item, markup=False, highlight=False)
            return
        finished = item.reused + item.done
        if task is None:
            bar.start()
            task = bar.add_task("points", total=item.total, completed=finished, failed=0)
        bar.update(task, completed=finished, failed=item.failed)
        if finished >= item.total:
            bar.stop()

    show.close = bar.stop  # an interrupted sweep gives the terminal back
    return show
