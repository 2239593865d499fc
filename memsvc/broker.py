"""Local mode's broker: kombu's filesystem transport, made safe for a reader and a writer at once.

kombu 5.7's writer creates the message file under its final name, then locks it and writes;
its reader moves and reads files without the lock. A reader that comes between the two reads
an empty file, ``json.loads("")`` raises in the worker's event loop, and Celery exits
("Unrecoverable error: JSONDecodeError", kombu issue #1551; docs/benchmarks.md). Here:

- a message is written whole under a name the reader ignores, flushed, then renamed into the
  queue folder: ``rename`` is atomic, so a reader sees no file or the whole message;
- the reader claims a file by renaming it into a claim folder on the same filesystem (one of
  several readers wins, the others move on), and a file that does not hold a message (left
  by an older writer, or damaged) is set aside in ``<queue>/../rejected`` with a warning,
  never the end of the worker.

``memsvc.celery`` makes it what ``filesystem://`` names.
"""

import contextlib
import logging
import os
import uuid
from pathlib import Path

from kombu.exceptions import ChannelError, DecodeError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

logger = logging.getLogger(__name__)

# A name the reader never takes for a message: kombu's reader wants "<stamp>_<id>.<queue>.msg"
# and compares what follows the first dot with "<queue>.msg"; this one starts with a dot.
_PARTIAL_SUFFIX = ".partial"
# AMQP's delivery mode of a message that need not outlive the machine (a use count; a
# message to embed, which the sweep embeds anyway): written without waiting for the disk.
TRANSIENT = 1


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        """Write the message whole under a temporary name, then rename it into the queue."""
        folder = self.data_folder_out
        name = f"{int(filesystem.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        partial = os.path.join(folder, f".{uuid.uuid4()}{_PARTIAL_SUFFIX}")
        try:
            with open(partial, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
                handle.flush()
                if payload.get("properties", {}).get("delivery_mode") != TRANSIENT:
                    os.fsync(handle.fileno())
            os.rename(partial, os.path.join(folder, name))
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise ChannelError(f"Cannot add file {name!r} to directory") from exc

    def _get(self, queue):
        """The oldest whole message of ``queue``; files that hold none are set aside."""
        wanted = f"{queue}.msg"
        folder = Path(self.data_folder_in)
        claimed_folder = folder.parent / "claimed"
        for name in sorted(os.listdir(folder)):
            if name.partition(".")[2] != wanted:
                continue
            claimed = claimed_folder / name
            claimed_folder.mkdir(exist_ok=True)
            try:
                # Same filesystem, so a rename: exactly one reader gets the file.
                os.rename(folder / name, claimed)
            except OSError:
                continue  # another reader took it
            try:
                payload = claimed.read_bytes()
            except IsADirectoryError:  # (a folder of the name ended the worker: review)
                self._reject(claimed, 0)
                continue
            except OSError as exc:  # (a message, maybe: back in the queue for the next try)
                with contextlib.suppress(OSError):
                    os.rename(claimed, folder / name)
                raise ChannelError(f"Cannot read file {name!r} from queue.") from exc
            try:
                message = loads(bytes_to_str(payload))
                # What the worker makes of it: JSON that is no message (no delivery tag, a
                # body its encoding does not decode, a task's body of another shape) ended
                # the worker too, and every worker started after it (review).
                if not task_shaped(self.Message(message, channel=self)):
                    raise ValueError("a task's body of another shape")
            except (
                ValueError,
                UnicodeDecodeError,
                KeyError,
                TypeError,
                AttributeError,
                RecursionError,
                DecodeError,
            ):
                self._reject(claimed, len(payload))
                continue
            if self.store_processed:
                os.replace(claimed, Path(self.processed_folder) / name)
            else:
                claimed.unlink()
            return message
        raise filesystem.Empty()

    def _reject(self, path: Path, size: int) -> None:
        rejected = path.parent.parent / "rejected"
        rejected.mkdir(parents=True, exist_ok=True)
        os.replace(path, rejected / path.name)
        logger.warning(
            "broker: %s (%d bytes) holds no message; moved to %s", path.name, size, rejected
        )


def task_shaped(message) -> bool:
    """Whether a Celery task message's JSON body is what its worker unpacks: ``[args,
    kwargs, embed]`` (any broker's: ``memsvc.celery.Task``'s strategy asks too). Other
    messages, and bodies of other types (which the worker refuses itself, and which are
    never decoded here: a pickle would run), are not looked into."""
    if "task" not in (message.headers or {}) or message.content_type != "application/json":
        return True
    body = message.decode()  # (kept for the worker's own read; compressed ones too)
    return (
        isinstance(body, list)
        and len(body) == 3
        and isinstance(body[0], list)
        and isinstance(body[1], dict)
        and isinstance(body[2], dict | None)
    )


class Transport(filesystem.Transport):
    Channel = Channel

    def establish_connection(self):
        """kombu's, which opens a folder without a look: a queue folder no message could be
        written to (made read-only, not a folder) was "reachable" to the health probe while
        every send failed (review). A connection is one that can write (the folder made
        if it is not yet: ``memsvc.celery.make_local_queue_folders``)."""
        connection = super().establish_connection()
        folder = Path(self._avail_channels[-1].data_folder_out)
        probe = folder / f".{uuid.uuid4()}{_PARTIAL_SUFFIX}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            probe.unlink()
        except OSError as exc:
            raise ChannelError("cannot write in the queue folder") from exc
        return connection

    @property
    def default_connection_params(self):
        # A folder has no host: without this kombu warns "No hostname was supplied" when a
        # process first describes its connection (memsvc import, memsvc mcp).
        return {"port": self.default_port}
