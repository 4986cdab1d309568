"""Where a process keeps its sessions: the one place that turns ``[storage]`` into a store.

``storage.url`` empty is the embedded default, one SQLite file in ``storage.data_dir``; a
``postgresql://`` URL is the shared store every node of a cluster writes (docs/storage.md). The
rest of voicegate asks this module for store objects and never names a backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from config.settings import StorageSettings
from session.store import SessionStore
from session.store.migrations import SCHEMA_VERSION
from session.store.postgres import Availability, PostgresSessionStore, redact
from session.store.sqlite import SqliteSessionStore

SQLITE_FILE: Final = "voicegate.sqlite3"


@dataclass(frozen=True, slots=True)
class StoreLocation:
    url: str  # "" for the embedded SQLite file
    sqlite_path: Path

    @classmethod
    def of(cls, storage: StorageSettings) -> StoreLocation:
        return cls(storage.url, Path(storage.data_dir) / SQLITE_FILE)

    @property
    def backend(self) -> str:
        return "postgresql" if self.url else "sqlite"

    def describe(self) -> str:
        """For logs and messages: the file, or the URL without its password."""
        return redact(self.url) if self.url else str(self.sqlite_path)

    def open(
        self,
        *,
        upgrade: bool = False,
        retry: bool = False,
        availability: Availability | None = None,
    ) -> SessionStore:
        """A new store object (one connection: give each thread its own).

        ``retry``: wait out a database that does not answer instead of raising StoreUnavailable
        (the writer's store, session/store/writer.py). Raises SchemaTooOld / SchemaTooNew for a
        schema this release does not write, unless ``upgrade`` steps an older one up.
        """
        if self.url:
            return PostgresSessionStore(
                self.url, upgrade=upgrade, retry=retry, availability=availability
            )
        return SqliteSessionStore(self.sqlite_path, upgrade=upgrade)

    def migrate(self) -> tuple[int, int]:
        """Apply every migration this release has (``voicegate migrate``): (found, now)."""
        store = self.open(upgrade=True)
        try:
            found = getattr(store, "found_version", SCHEMA_VERSION)
        finally:
            store.close()
        return int(found), SCHEMA_VERSION
