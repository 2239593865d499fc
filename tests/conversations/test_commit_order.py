"""A reader resuming after a message never skips one: within a conversation, ``seq`` order is
commit order, however many writers append at once."""

import random
import threading
import time

import pytest
from django.db import connection, transaction

from conversations import selectors, services
from conversations.services import NewMessage
from memsvc.api.principals import Principal
from tests.factories import ConversationFactory

WRITERS = 8
PER_WRITER = 15


def slow_after_insert(execute, sql, params, many, context):
    """Hold the transaction open a little after the messages drew their numbers: a later
    number may then commit first, unless the append orders them."""
    result = execute(sql, params, many, context)
    if sql.lstrip().upper().startswith('INSERT INTO "MESSAGE"'):
        time.sleep(random.uniform(0, 0.02))  # noqa: S311 (a delay, not a secret)
    return result


@pytest.mark.django_db(transaction=True)
def test_a_reader_resuming_after_a_message_misses_none_while_writers_race():
    with transaction.atomic():
        conversation = ConversationFactory(group__owner="alice")
    alice = Principal.user("alice")
    errors, seen = [], []
    writing = threading.Event()
    writing.set()

    def write(number):
        try:
            with connection.execute_wrapper(slow_after_insert):
                for index in range(PER_WRITER):
                    services.messages_append(
                        alice,
                        conversation=conversation,
                        messages=[NewMessage(content=f"writer {number} message {index}")],
                    )
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    def read():
        """An agent paging its context with ``afterMessageId`` as fast as it can."""
        after = None
        try:
            while True:
                still_writing = writing.is_set()
                page = selectors.conversation_context(conversation, after=after, limit=20)
                seen.extend(message.id for message in page.messages)
                if page.messages:
                    after = page.messages[-1]
                elif not still_writing:
                    return
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    reader = threading.Thread(target=read)
    writers = [threading.Thread(target=write, args=(n,)) for n in range(WRITERS)]
    reader.start()
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    writing.clear()
    reader.join(timeout=60)

    assert errors == []
    stored = list(conversation.messages.order_by("seq").values_list("id", flat=True))
    assert len(stored) == WRITERS * PER_WRITER
    assert seen == stored  # every message, once, in order: none passed while uncommitted
