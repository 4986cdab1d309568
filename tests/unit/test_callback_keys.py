"""The installation's callback key (voicegate/call/callback_keys.py): workers of a pool starting
at once make it once and all read the whole of it. Seen in CI: a worker read the file another
had created but not yet written, refused to start ("holds 0 bytes") and was restarted."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from voicegate.call.callback_keys import KEY_BYTES, KEY_FILE, CallbackKeys

STARTS = 6  # workers starting at once, as a pool's first wave does
ROUNDS = 30


def _start(data_dir: str, ready: object, results: object) -> None:
    ready.wait()  # type: ignore[attr-defined]
    try:
        keys = CallbackKeys.in_directory(Path(data_dir))
        results.put(keys.caller("t", "+15550001234"))  # type: ignore[attr-defined]
    except ValueError as exc:
        results.put(f"refused: {exc}")  # type: ignore[attr-defined]


def test_workers_starting_at_once_all_read_the_one_whole_key(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    for round_ in range(ROUNDS):
        data_dir = tmp_path / f"data-{round_}"
        data_dir.mkdir()
        ready, results = ctx.Barrier(STARTS), ctx.Queue()
        workers = [
            ctx.Process(target=_start, args=(str(data_dir), ready, results))
            for _ in range(STARTS)
        ]
        for worker in workers:
            worker.start()
        seen = [results.get(timeout=30) for _ in workers]
        for worker in workers:
            worker.join(timeout=30)
        assert len(set(seen)) == 1 and not seen[0].startswith("refused"), (round_, seen)
        assert len((data_dir / KEY_FILE).read_bytes()) == KEY_BYTES
        assert [p.name for p in data_dir.iterdir()] == [KEY_FILE]  # nothing left behind


def test_a_truncated_key_is_refused_clearly(tmp_path: Path) -> None:
    (tmp_path / KEY_FILE).write_bytes(b"short")
    try:
        CallbackKeys.in_directory(tmp_path)
    except ValueError as exc:
        assert "holds 5 bytes" in str(exc) and "remove it" in str(exc)
    else:
        raise AssertionError("a truncated key was taken")
