"""Local mode's broker (memsvc.broker): no reader ever sees half a message, and a bad file in
the queue is set aside rather than the end of the worker (kombu issue #1551)."""

import base64
import json
import logging
import threading
import uuid

import pytest
from kombu import Connection
from kombu.exceptions import OperationalError
from kombu.transport import filesystem

from memsvc import broker
from memsvc.celery import app  # names memsvc.broker as "filesystem://"


@pytest.fixture
def folders(tmp_path):
    options = {
        "data_folder_in": str(tmp_path / "queue"),
        "data_folder_out": str(tmp_path / "queue"),
        "processed_folder": str(tmp_path / "processed"),
        "control_folder": str(tmp_path / "control"),
        "store_processed": False,
    }
    for name in ("queue", "processed", "control"):
        (tmp_path / name).mkdir()
    return tmp_path, options


def channel(options, transport=broker.Transport):
    connection = Connection("filesystem://", transport=transport, transport_options=options)
    return connection, connection.default_channel


def message(body: str, **properties) -> dict:
    """A payload as kombu's channel gives one to ``_put`` (``basic_publish``)."""
    return {
        "body": body,
        "properties": {"delivery_tag": str(uuid.uuid4()), "delivery_info": {}, **properties},
    }


def write_in_progress(queue_folder, queue="celery"):
    """What kombu's own writer leaves for an instant: the message file, created and still empty
    (it opens the final name, then locks, then writes)."""
    path = queue_folder / f"1_00000000-0000-0000-0000-000000000000.{queue}.msg"
    path.write_bytes(b"")
    return path


def test_kombus_own_reader_dies_on_a_message_being_written(folders):
    """The race itself: the stock reader takes the writer's empty file for a message."""
    tmp_path, options = folders
    write_in_progress(tmp_path / "queue")
    connection, stock = channel(options, transport=filesystem.Transport)
    with connection, pytest.raises(json.JSONDecodeError):
        stock._get("celery")


def test_the_queue_folders_made_are_their_users_alone(tmp_path, monkeypatch):
    """(They were 0755, the tasks' files anyone's to read where the data directory lets
    others pass through, as root's does for the embedded PostgreSQL: review.)"""
    from memsvc.celery import make_local_queue_folders

    options = {
        "data_folder_in": str(tmp_path / "broker" / "queue"),
        "data_folder_out": str(tmp_path / "broker" / "queue"),
        "processed_folder": str(tmp_path / "broker" / "processed"),
        "control_folder": str(tmp_path / "broker" / "control"),
    }
    monkeypatch.setitem(app.conf, "broker_transport_options", options)
    monkeypatch.setitem(app.conf, "broker_url", "filesystem://")
    make_local_queue_folders()
    for folder in ("broker", "broker/queue", "broker/processed", "broker/control"):
        assert (tmp_path / folder).stat().st_mode & 0o077 == 0, folder


def test_the_url_names_memsvcs_transport():
    assert Connection("filesystem://").transport_cls == "filesystem"
    assert isinstance(Connection("filesystem://").transport, broker.Transport)


def test_a_file_that_holds_no_message_is_set_aside_and_the_next_one_read(folders, caplog):
    tmp_path, options = folders
    connection, ours = channel(options)
    with connection:
        bad = write_in_progress(tmp_path / "queue")
        ours._put("celery", message("after the bad file"))

        assert ours._get("celery")["body"] == "after the bad file"
        with pytest.raises(filesystem.Empty):
            ours._get("celery")
    assert (tmp_path / "rejected" / bad.name).exists()
    assert "holds no message" in caplog.text


@pytest.mark.parametrize(
    "content",
    [
        b'{"body": "xx", "properties": {}}',  # no delivery tag: KeyError in the worker
        b'{"body": "xx"}',
        b"[1, 2]",
        b'"a string"',
        b'{"body": "a", "properties": {"delivery_tag": "t", "body_encoding": "base64"}}',
    ],
)
def test_a_file_of_json_that_is_no_message_is_set_aside_too(folders, caplog, content):
    """JSON, but not what kombu makes of a message: the worker ended ("Unrecoverable error:
    KeyError('delivery_tag')"), and what it had taken was left to the sweep (review)."""
    tmp_path, options = folders
    connection, ours = channel(options)
    with connection:
        bad = tmp_path / "queue" / "1_00000000-0000-0000-0000-000000000001.celery.msg"
        bad.write_bytes(content)
        ours._put("celery", message("after the bad file"))
        got = ours._get("celery")
        assert got["body"] == "after the bad file"
        ours.Message(got, channel=ours)  # (what the worker makes of it)
        # (Whichever comes first by name: "1_..." sorts after a stamp of "12...")
        with pytest.raises(filesystem.Empty):
            ours._get("celery")
    assert (tmp_path / "rejected" / bad.name).exists()
    assert "holds no message" in caplog.text


def test_a_connection_is_one_that_can_write_in_the_queue(folders):
    """kombu's opened a folder without a look: the health probe said "reachable" while every
    send failed (review)."""
    tmp_path, options = folders
    with Connection("filesystem://", transport_options=options) as connection:
        connection.ensure_connection(max_retries=0)
    (tmp_path / "not-a-folder").write_text("")
    unwritable = {**options, "data_folder_out": str(tmp_path / "not-a-folder")}
    with (
        Connection("filesystem://", transport_options=unwritable) as connection,
        pytest.raises(OperationalError, match="cannot write in the queue folder"),
    ):
        connection.ensure_connection(max_retries=0)
    assert not list((tmp_path / "queue").iterdir())  # (no probe left behind)


def test_a_message_is_never_visible_before_it_is_whole(folders, monkeypatch):
    """The writer leaves nothing under a message's name until the message is complete."""
    tmp_path, options = folders
    seen_partial = []
    real_rename = broker.os.rename

    def rename_and_look(src, dst):
        # Just before the rename: the queue folder holds no message file yet.
        seen_partial.extend(
            name for name in (tmp_path / "queue").iterdir() if name.name.endswith(".msg")
        )
        return real_rename(src, dst)

    connection, ours = channel(options)
    with connection:
        monkeypatch.setattr(broker.os, "rename", rename_and_look)
        ours._put("celery", message("x" * 100_000))
        monkeypatch.undo()
        assert seen_partial == []
        assert ours._get("celery")["body"] == "x" * 100_000


def test_a_transient_message_is_written_without_waiting_for_the_disk(folders, monkeypatch):
    _, options = folders
    synced = []
    real_fsync = broker.os.fsync
    monkeypatch.setattr(broker.os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    connection, ours = channel(options)
    with connection:
        ours._put("celery", message("a use count", delivery_mode=1))
        assert synced == []
        ours._put("celery", message("a lasting task", delivery_mode=2))
        ours._put("celery", message("no mode said"))
        assert len(synced) == 2  # persistent unless said otherwise
        bodies = [ours._get("celery")["body"] for _ in range(3)]
    assert sorted(bodies) == ["a lasting task", "a use count", "no mode said"]


def test_concurrent_writers_and_readers_get_every_message_once_and_whole(folders):
    tmp_path, options = folders
    writers, per_writer, readers = 4, 150, 3
    received, errors = [], []
    done_writing = threading.Event()

    def write(number):
        connection, ours = channel(options)
        with connection:
            for index in range(per_writer):
                sent = {"writer": number, "index": index, "pad": "p" * 2_000}
                ours._put("celery", message(json.dumps(sent)))

    def read():
        connection, ours = channel(options)
        with connection:
            while True:
                try:
                    received.append(json.loads(ours._get("celery")["body"]))
                except filesystem.Empty:
                    if done_writing.is_set():
                        return
                except Exception as exc:  # what killed the worker
                    errors.append(exc)
                    return

    reader_threads = [threading.Thread(target=read) for _ in range(readers)]
    writer_threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    for thread in reader_threads + writer_threads:
        thread.start()
    for thread in writer_threads:
        thread.join()
    done_writing.set()
    for thread in reader_threads:
        thread.join(timeout=60)

    assert errors == []
    keys = sorted((m["writer"], m["index"]) for m in received)
    assert keys == sorted((w, i) for w in range(writers) for i in range(per_writer))
    assert all(m["pad"] == "p" * 2_000 for m in received)
    assert not (tmp_path / "rejected").exists()


def test_describing_the_connection_warns_of_no_missing_host(caplog):
    """A folder has no host ("No hostname was supplied" at the start of memsvc import/mcp)."""
    with caplog.at_level("WARNING"), app.connection_for_write() as connection:
        connection.info()
    assert not [r for r in caplog.records if "hostname" in r.getMessage()]


def task(body, content_type="application/json") -> dict:
    """A Celery task message as the worker gets one: its body base64-encoded JSON."""
    encoded = base64.b64encode(json.dumps(body).encode()).decode()
    return {
        "body": encoded,
        "content-type": content_type,
        "content-encoding": "utf-8",
        "headers": {"task": "search.embed_messages", "id": str(uuid.uuid4())},
        "properties": {
            "delivery_tag": str(uuid.uuid4()),
            "delivery_info": {},
            "body_encoding": "base64",
        },
    }


@pytest.mark.parametrize("body", [{"a": 1}, [[], {}], [{}, {}, {}], ["x", {}, {}], "text"])
def test_a_task_whose_body_is_of_another_shape_is_set_aside(folders, caplog, body):
    """The worker unpacks a task's body as ``[args, kwargs, embed]``: one of another shape
    ended it ("not enough values to unpack"), it gave the message back to the queue, and
    every worker started after it ended on it again (review)."""
    tmp_path, options = folders
    connection, ours = channel(options)
    with connection:
        bad = tmp_path / "queue" / "1_00000000-0000-0000-0000-000000000002.celery.msg"
        bad.write_text(json.dumps(task(body)))
        ours._put("celery", task([["m1"], {}, {"callbacks": None}]))
        got = ours.Message(ours._get("celery"), channel=ours)
        assert json.loads(got.body) == [["m1"], {}, {"callbacks": None}]
        with pytest.raises(filesystem.Empty):
            ours._get("celery")
    assert (tmp_path / "rejected" / bad.name).exists()
    assert "holds no message" in caplog.text


def test_a_folder_named_as_a_message_is_set_aside(folders, caplog):
    """(Reading it raised ChannelError, which ended the worker.)"""
    tmp_path, options = folders
    connection, ours = channel(options)
    with connection:
        folder = tmp_path / "queue" / "0_dir.celery.msg"
        folder.mkdir()
        ours._put("celery", message("after the folder"))
        assert ours._get("celery")["body"] == "after the folder"
    assert (tmp_path / "rejected" / folder.name).is_dir()


def test_beat_says_a_task_it_could_not_send_in_a_line_a_minute(tmp_path, caplog, monkeypatch):
    """With the broker down (or its queue folder not writable) Celery's beat logged a
    traceback and the stack above it for every sweep, every minute (reviews)."""
    from celery.beat import ScheduleEntry
    from kombu.exceptions import OperationalError as BrokerDown

    from memsvc import celery as memsvc_celery

    assert memsvc_celery.app.conf.beat_scheduler == "memsvc.celery:Scheduler"  # (beat's)
    scheduler = memsvc_celery.Scheduler(
        app=memsvc_celery.app, schedule_filename=str(tmp_path / "schedule"), lazy=True
    )

    def down(*args, **kwargs):
        raise BrokerDown("[Errno 30] Read-only file system")

    monkeypatch.setattr(scheduler, "apply_async", down)
    entry = ScheduleEntry(name="sweep", task="search.sweep_unembedded", app=memsvc_celery.app)
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            scheduler.apply_entry(entry)
    said = [r for r in caplog.records if "could not send" in r.getMessage()]
    assert len(said) == 1 and said[0].exc_info is None
    assert "search.sweep_unembedded ([Errno 30] Read-only file system)" in said[0].getMessage()
    assert "Traceback" not in caplog.text and "Message Error" not in caplog.text
