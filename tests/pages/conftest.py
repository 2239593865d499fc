"""People with a login for the web pages (``memsvc user create``): alice, bob and charlie,
each a test client that logged in with a password, as a browser does."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from conversations import services
from memsvc.api.principals import Principal

PASSWORD = "a long enough password"


def login(username: str, **client_options) -> Client:
    user, _ = get_user_model().objects.get_or_create(username=username)
    user.set_password(PASSWORD)
    user.save()
    client = Client(**client_options)
    assert client.login(username=username, password=PASSWORD)
    return client


@pytest.fixture
def alice_page(db):
    return login("alice")


@pytest.fixture
def bob_page(db):
    return login("bob")


@pytest.fixture
def charlie_page(db):
    return login("charlie")


def conversation_of(owner: str, title: str = "Trip plans", *messages: str, shared=()):
    """A conversation as the API would make it: created, its messages appended, shared."""
    actor = Principal.user(owner)
    conversation = services.conversation_create(actor, title=title)
    for text in messages:
        services.message_append(actor, conversation=conversation, content=text)
    for principal_id, level in shared:
        services.membership_create(
            actor, conversation=conversation, principal_id=principal_id, access_level=level
        )
    return conversation
