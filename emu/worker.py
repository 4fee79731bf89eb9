"""A thread beside the replay whose failure the engine re-raises in its own thread."""

from __future__ import annotations

import threading


class Worker(threading.Thread):
    """A daemon thread that runs `work()` and keeps what it raised in `error`."""

    def __init__(self, name: str):
        super().__init__(name=name, daemon=True)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.work()
        except BaseException as e:  # noqa: BLE001 - re-raised by the engine
            self.error = e

    def work(self) -> None:
        raise NotImplementedError
