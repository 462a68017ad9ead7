"""The read board (engine/service/board.py): what a warm reader trusts instead of a round trip."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mooncake_assets.engine.service.board import Board, BoardReader, EpochLock, board_path


def test_a_writing_hold_moves_the_epoch_a_reading_hold_does_not(tmp_path):
    lock = EpochLock()
    board = Board(board_path(tmp_path / "s.sock"))
    applied = [7]
    lock.attach(board, lambda: applied[0])
    reader = BoardReader(tmp_path / "s.sock.board")
    first = reader.snapshot()
    assert first is not None and first.incarnation == board.incarnation and first.applied == 7
    with lock.reading():
        assert lock.epoch == first.epoch
    assert reader.snapshot() == first  # a read changes nothing
    with lock.reading(), lock:  # a writing hold nested in a reading one counts, once, at the end
        applied[0] = 9
    assert reader.snapshot() == (board.incarnation, first.epoch + 1, 9)
    with pytest.raises(RuntimeError), lock.reading():
        raise RuntimeError("a table stopped on the way")
    assert reader.snapshot().epoch == first.epoch + 2  # an error inside a read counts as a change
    lock.acquire()
    lock.acquire()
    lock.release()
    assert reader.snapshot().epoch == first.epoch + 2  # published when the outermost hold ends
    lock.release()
    assert reader.snapshot().epoch == first.epoch + 3


def test_a_stopped_or_replaced_or_dead_service_board_is_not_trusted(tmp_path):
    path = tmp_path / "s.sock.board"
    reader = BoardReader(path)
    assert reader.snapshot() is None  # no board
    old = Board(path)
    old.publish(5, 10)
    assert reader.snapshot() is not None
    new = Board(path)  # a restarted service: a new file and incarnation
    new.publish(5, 10)
    snap = reader.snapshot()
    assert snap is not None and snap.incarnation == new.incarnation != old.incarnation
    new.close()
    assert reader.snapshot() is None and not path.exists()
    # a board whose service process is gone (killed: nobody closed it)
    code = "import sys; from mooncake_assets.engine.service.board import Board; b = Board(sys.argv[1]); b.publish(3, 4)"
    subprocess.run([sys.executable, "-c", code, str(path)], check=True)
    assert path.exists() and reader.snapshot() is None
    path.write_bytes(b"not a board" + bytes(64))
    assert reader.snapshot() is None
    assert os.stat(path).st_size > 0
