"""The embedded broker: Kombu's filesystem transport, with messages taken in the order they were sent.

Kombu names each message file after the milliseconds of the monotonic clock, without padding, and a worker takes the
first name in sorted order. Once that count gains a digit (about 17 minutes, 2.8 hours and 28 hours after the
machine starts), every later message sorts before the earlier ones, so a queued run can wait behind all the work sent
after it; and since the monotonic clock restarts with the machine, messages left from before a restart sort at
random among new ones. Here a message's name starts with the wall clock's nanoseconds at a fixed width, so sorted
order is sending order, and the file appears under its name only once it is whole (written under a name no queue
reads, then renamed), so a worker never reads half a message.

`feedback_app.settings` sets ``CELERY_BROKER_TRANSPORT`` to this module's `Transport` when the broker URL is
``filesystem://``.
"""

from __future__ import annotations

import os
import uuid
from time import time_ns

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

# Nanoseconds since 1970 take 19 digits until the year 2286.
STAMP_DIGITS = 20


def message_name(queue: str, stamp: int | None = None) -> str:
    """The file name of a message for `queue`: a fixed-width time stamp, a unique id, and the queue Kombu reads by."""
    return f"{time_ns() if stamp is None else stamp:0{STAMP_DIGITS}d}_{uuid.uuid4()}.{queue}.msg"


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs) -> None:
        name = message_name(queue)
        final = os.path.join(self.data_folder_out, name)
        # Kombu takes a file only when everything after its first dot is "<queue>.msg"; ".partial" is never that.
        partial = os.path.join(self.data_folder_out, f"{name}.partial")
        try:
            with open(partial, "wb", buffering=0) as file:
                file.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
