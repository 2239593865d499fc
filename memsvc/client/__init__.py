"""``learning()``: memory for any script that uses the OpenAI or Anthropic client, in one
``with`` line.

    from memsvc.client import learning

    with learning(agent="my_agent"):
        client.chat.completions.create(model=..., messages=[...])

Inside the block every model call of the ``openai`` package (chat completions and the
Responses API: ``create``, ``parse``, ``stream``, ``with_raw_response``,
``with_streaming_response``) and of the ``anthropic`` package (``messages.create``,
``messages.stream``), sync or async, first asks memsvc (one ``POST /context/{agent}``) for
the agent's memory blocks and the long-term memories and past messages most relevant to the
user's last message, and passes them to the model (a system message, the Responses
``instructions``, Anthropic's ``system``). The user's message and the reply are then stored
by a background sender, off the caller's path. What the call returns is exactly what it
returns without memsvc; if memsvc fails during a call, or does not answer within the call's
own timeout, one warning is logged and the call goes on without memory.

The package needs only ``httpx`` (and the SDKs it serves): it never imports Django.

- ``formatting``: the memory as the model reads it (pure functions)
- ``core``: the I/O-free core: which calls, what to ask, what to send, how a reply reads,
  what to store (the strategy)
- ``hooks``: the thin sync and async shells around the SDKs' request path
- ``sender``: the background sender of stores
- ``session``: ``learning`` itself
"""

from memsvc.client.formatting import format_context, inject
from memsvc.client.session import (
    AgentRefused,
    MemoryServerUnavailable,
    learning,
    server_url_from_env,
)

__all__ = [
    "AgentRefused",
    "MemoryServerUnavailable",
    "format_context",
    "inject",
    "learning",
    "server_url_from_env",
]
