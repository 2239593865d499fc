"""An agent answering a person in a conversation (the web pages' chat), with the context an
agent gets anywhere else: its memory blocks, its long-term memories about that person and the
relevant past messages (the format ``learning()`` injects, ``memsvc.client.format_context``),
then the conversation's latest turns. The reply is the agent's message, written as the agent
acting for the person; what follows an agent's write (memory extraction) follows it too.
"""

import threading
from collections.abc import Callable, Iterator

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from agents_api import selectors
from agents_api.models import Agent
from agents_api.services import agent_get_or_create
from agents_api.services.messages import agent_messages_append
from agents_api.tasks import enqueue_memory_extraction, enqueue_memory_touch
from conversations.models import AccessLevel, Conversation, Role
from conversations.selectors import (
    access_conversation,
    agent_members,
    conversation_messages,
    latest_user_text,
    user_members,
)
from conversations.services import NewMessage, within_message_limit
from memsvc.api.errors import Conflict, RateLimited
from memsvc.api.principals import PAGES_OWNER, Principal
from memsvc.client import format_context
from memsvc.db import locked_row
from memsvc.llm import chat_stream
from memsvc.text import shows_nothing
from search.selectors import search_messages

RECENT_TURNS = 20  # the conversation's latest messages, verbatim, after the context
SPEAKERS = {Role.USER: "user", Role.ASSISTANT: "assistant", Role.AGENT: "assistant"}


# The agent that answers in conversations made on the pages (with "with the assistant").
PAGES_ASSISTANT = (PAGES_OWNER, "assistant")  # (owner_principal, name)


def pages_assistant() -> Agent:
    owner, name = PAGES_ASSISTANT
    return agent_get_or_create(
        owner_principal=owner, name=name, description="Answers in conversations on the web pages."
    )[0]


class _Answering:
    """The answers being written in this process. Each holds a web request thread for the
    model's whole time: at most ``MEMSVC_PAGES_ANSWERS_AT_ONCE`` of them, so that slow
    answers never hold every thread and the API stops for everyone."""

    RETRY_SECONDS = 5

    def __init__(self):
        self.lock = threading.Lock()
        self.now = 0

    def _refuse_when_full(self) -> None:
        if self.now >= settings.MEMSVC_PAGES_ANSWERS_AT_ONCE:
            raise RateLimited(
                self.RETRY_SECONDS,
                "the assistant is answering too many people at once; ask again shortly",
            )

    def check(self) -> None:
        """``RateLimited`` when every place is taken now: a look, not a hold (the page's
        script keeps the message, then asks for the answer, which takes a place)."""
        with self.lock:
            self._refuse_when_full()

    def take(self) -> Callable[[], None]:
        """A place for one answer: its release (once, whatever calls it again), or
        ``RateLimited`` when every place is taken."""
        with self.lock:
            self._refuse_when_full()
            self.now += 1
        given_back = threading.Event()

        def release() -> None:
            with self.lock:
                if not given_back.is_set():
                    given_back.set()
                    self.now -= 1

        return release


answering = _Answering()


def assistant_of(conversation: Conversation, *, asked_by: str) -> Agent | None:
    """The agent that answers ``asked_by`` in a conversation on the pages: the first agent
    that may write in it, of those that are the pages' assistant or the person's own
    (``owner_principal``). Another owner's agent, shared into the conversation, answers
    through its own API only: on the pages its blocks would go into a prompt the person
    writes (and reads back), and its store would keep what it is told (review)."""
    order = agent_members(conversation, writers=True)
    agents = Agent.objects.filter(_the_persons_own(asked_by)).in_bulk(order)  # one query
    return next((agents[agent_id] for agent_id in order if agent_id in agents), None)


def read_by_others(conversation: Conversation, user_id: str) -> bool:
    """Whether anyone but ``user_id`` reads the conversation: another person, or an agent
    that is not theirs nor the pages' assistant (its owner reads what it reads, through its
    key: one shared with another person's agent was given the asker's memories and other
    conversations; review)."""
    if user_members(conversation) - {user_id}:
        return True
    others = Agent.objects.filter(id__in=agent_members(conversation))
    return others.exclude(_the_persons_own(user_id)).exists()


def _the_persons_own(user_id: str) -> Q:
    """The agents that are the person's own on the pages: the pages' assistant, and those
    the person owns."""
    owner, name = PAGES_ASSISTANT
    return Q(owner_principal=owner, name=name) | Q(owner_principal=user_id)


def assistant_prompt(agent: Agent, conversation: Conversation, *, user_id: str) -> list[dict]:
    """The chat messages to send: the agent's context as a system message, then the latest
    turns of the conversation's view. The memories used count as uses.

    The answer is read by every member: in a conversation others read too, the context is
    only what they all may read (the agent's own blocks, this conversation's messages),
    never what the agent keeps about the person asking or their other conversations."""
    query = latest_user_text(conversation)
    private = not read_by_others(conversation, user_id)
    memories = []
    if private:
        memories = selectors.memories_for_context(
            agent, user_id=user_id, query=query, limit=settings.MEMORY_DEFAULT_SEARCH_LIMIT
        )
        enqueue_memory_touch([hit.memory.id for hit in memories])
    recent = list(conversation_messages(conversation).order_by("-seq")[:RECENT_TURNS])[::-1]
    shown = {message.id for message in recent}
    relevant = []
    if not shows_nothing(query):
        hits = search_messages(
            agent.as_principal(on_behalf_of=user_id),
            query=query,
            top_k=settings.MEMORY_MAX_CONTEXT_MESSAGES,
            conversation_ids=None if private else [conversation.id],
            highlights=False,
        )
        relevant = [hit.message for hit in hits if hit.message.id not in shown]
    context = format_context(
        {
            "memory_blocks": [
                {"label": block.label, "value": block.value}
                for owner in (("", user_id) if private else ("",))
                for block in selectors.memory_blocks(agent, user_id=owner)
            ],
            "memories": [{"content": hit.memory.content} for hit in memories],
            "relevant_messages": [
                {"role": m.role, "content": m.content, "created_at": m.created_at.isoformat()}
                for m in relevant
            ],
        }
    )
    turns = [
        {"role": SPEAKERS.get(message.role, "user"), "content": message.content}
        for message in recent
    ]
    return ([{"role": "system", "content": context}] if context else []) + turns


# Ends a streamed answer the model failed to write (nothing is kept): the pages' chat script
# shows what follows it as the answer's refusal, which may be asked for again. A control
# character, taken out of the model's own text (streamed and kept alike).
ANSWER_FAILED = "\x1e"


def assistant_reply(
    agent: Agent, conversation: Conversation, *, user: Principal, turn=None
) -> Iterator[str]:
    """The agent's answer, piece by piece as the model writes it; once it is whole, it is
    appended to the conversation as the agent's message (``LLMError`` when the model fails,
    an ``ApiError`` when it cannot be kept: nothing is written)."""
    actor = agent.as_principal(on_behalf_of=user.id)
    conversation = access_conversation(actor, conversation.id, need=AccessLevel.WRITER)
    # The turn the prompt ends on (``turn``: the caller's look at it, ``refuse_answered``).
    turn = turn or refuse_answered(conversation)
    pieces, room = [], settings.MEMSVC_MAX_MESSAGE_CHARS
    prompt = assistant_prompt(agent, conversation, user_id=user.id)
    stream = chat_stream(prompt, seconds=settings.MEMSVC_PAGES_ANSWER_SECONDS)
    try:
        for piece in stream:
            # (The model's own ``ANSWER_FAILED``: out, kept as streamed.) Only what can be
            # kept is streamed, and the model's stream is closed there: a model sending 200 MB
            # had it all sent on to the page, and held in the web process (review).
            piece = piece.replace(ANSWER_FAILED, "")[:room]
            pieces.append(piece)
            room -= len(piece)
            yield piece
            if not room:
                break
    finally:
        stream.close()
    with transaction.atomic():
        # Answers to one conversation are kept one at a time, each after a look at the
        # latest turn: two tabs asking at once both streamed an answer, and both kept it
        # (review). One is kept only as the answer to the turn its prompt ended on, still
        # the latest (``Conflict`` otherwise: answered meanwhile, or a newer turn came,
        # whose own answer answers it). (The lock an append takes: a conversation deleted
        # meanwhile is a 404 here.)
        locked_row(
            Conversation.objects.only("pk"),
            conversation.pk,
            missing="conversation not found",
            no_key=True,
        )
        refuse_answered(conversation, turn=turn)
        agent_messages_append(
            actor,
            conversation=conversation,
            messages=[
                NewMessage(content=within_message_limit("".join(pieces)), role=Role.ASSISTANT)
            ],
        )
    enqueue_memory_extraction(agent, conversation)


def refuse_answered(conversation: Conversation, *, turn=None):
    """The id of the conversation's latest turn (as its people see it), a person's waiting
    for its answer; ``Conflict`` when it is not, or is another than ``turn`` now."""
    latest = conversation_messages(conversation).order_by("-seq").only("role").first()
    if latest is None or latest.role != Role.USER:
        raise Conflict("nothing to answer: the latest turn has its answer")
    if turn is not None and latest.pk != turn:
        raise Conflict("a newer turn came meanwhile: the answer to it answers it")
    return latest.pk
