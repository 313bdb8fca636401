"""The embedded broker hands out messages in the order they were sent, even when Kombu's own file names would not
sort that way, and never hands out a message that is still being written."""

from __future__ import annotations

import os
import subprocess
import sys
from itertools import count

import pytest
from kombu import Connection
from kombu.transport import filesystem, virtual

from training import broker


@pytest.fixture(autouse=True)
def fresh_broker_state(monkeypatch):
    """Kombu keeps the exchanges it declared in one state for every filesystem transport of the process, and finds
    their bindings in the control folder: each test has its own folders, so it needs its own state too."""
    monkeypatch.setattr(filesystem.Transport, "global_state", virtual.BrokerState())


def connection(folder, transport) -> Connection:
    options = {
        "data_folder_in": str(folder),
        "data_folder_out": str(folder),
        "control_folder": str(folder.parent / f"{folder.name}-control"),  # Kombu's default is ./control
        "store_processed": False,
    }
    return Connection("filesystem://", transport=transport, transport_options=options)


def send_and_take(folder, transport, bodies: list[str]) -> list[str]:
    with connection(folder, transport) as conn:
        queue = conn.SimpleQueue("rollouts")
        for body in bodies:
            queue.put(body)
        taken = []
        for _ in bodies:
            message = queue.get(timeout=1)
            message.ack()
            taken.append(message.payload)
        queue.close()
    return taken


def test_kombu_s_own_names_hand_a_later_message_out_first_once_its_clock_gains_a_digit(tmp_path, monkeypatch):
    # The defect this transport exists for: 999 ms, then 1000 ms, sort as "1000_…" < "999_…".
    clock = iter([0.999, 1.0])
    monkeypatch.setattr(filesystem, "monotonic", lambda: next(clock))

    assert send_and_take(tmp_path, "filesystem", ["first", "second"]) == ["second", "first"]


def test_messages_are_handed_out_in_the_order_they_were_sent_across_digit_boundaries(tmp_path, monkeypatch):
    stamps = iter([999, 1_000, 99_999, 100_000, 10**18, 10**19 - 1])
    monkeypatch.setattr(broker, "time_ns", lambda: next(stamps))
    bodies = [f"run {n}" for n in range(6)]

    assert send_and_take(tmp_path, broker.Transport, bodies) == bodies
    assert os.listdir(tmp_path) == []


def test_a_message_still_being_written_is_not_handed_out(tmp_path, monkeypatch):
    ticks = count(1)
    monkeypatch.setattr(broker, "time_ns", lambda: next(ticks))
    # What a sender leaves while it writes: the whole name with ".partial" after it.
    half = tmp_path / f"{broker.message_name('rollouts', stamp=0)}.partial"
    half.write_bytes(b'{"body": "trunc')

    with connection(tmp_path, broker.Transport) as conn:
        queue = conn.SimpleQueue("rollouts")
        with pytest.raises(queue.Empty):
            queue.get(timeout=0.2)
        queue.put("whole")
        assert queue.get(timeout=1).payload == "whole"
        queue.close()
    assert half.exists()


def test_message_names_have_one_width_so_sorting_them_sorts_their_times():
    names = [broker.message_name("training", stamp) for stamp in (5, 50, 10**19)]
    assert len({len(name.partition("_")[0]) for name in names}) == 1
    assert sorted(names) == names
    assert all(name.partition(".")[2] == "training.msg" for name in names)


def test_the_celery_app_uses_this_transport_with_the_filesystem_broker(tmp_path):
    code = "from training.celery import app\nwith app.connection_for_write() as c: print(type(c.transport).__module__)"
    env = {key: value for key, value in os.environ.items() if key != "CELERY_BROKER_URL"}
    env.update(DJANGO_SETTINGS_MODULE="feedback_app.settings", TANDEM_DATA_DIR=str(tmp_path), SECRET_KEY="x")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "training.broker"
