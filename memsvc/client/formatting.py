"""Text in and out of a model call: the text of a message, the memory as the model reads it
(the seed's format), and where it goes in a list of chat messages. Pure functions."""

from datetime import UTC, datetime

from memsvc.text import shortened

MAX_CONTEXT_MESSAGE_CHARS = 500
CONTEXT_HEADER = "The following is context from your memory:"
TEXT_PART_TYPES = ("text", "input_text", "output_text")


def text_of(content) -> str:
    """The text of a message's content: a string, or the text parts of a list of blocks
    (OpenAI's ``text`` / ``input_text`` parts, Anthropic's ``text`` blocks)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict) and block.get("type") in TEXT_PART_TYPES:
                parts.append(str(block.get("text", "")))
            elif isinstance(block, str):
                parts.append(block)
        return "\n".join(part for part in parts if part)
    return ""


def is_tool_result(message) -> bool:
    """A tool's answer sent back to the model: a chat ``tool`` (or ``function``) message, a
    Responses ``*_call_output`` item, an Anthropic user message of ``tool_result`` blocks."""
    if not isinstance(message, dict):
        return False
    if message.get("role") in ("tool", "function"):
        return True
    if str(message.get("type", "")).endswith("_call_output"):
        return True
    content = message.get("content")
    return (
        message.get("role") == "user"
        and isinstance(content, list)
        and any(isinstance(block, dict) and block.get("type") == "tool_result" for block in content)
        and not text_of(content)
    )


def _last_user_index(messages) -> int | None:
    users = [
        index
        for index, message in enumerate(messages)
        if isinstance(message, dict)
        and message.get("role") == "user"
        and not is_tool_result(message)
    ]
    return users[-1] if users else None


def last_user_text(messages) -> str:
    """The text of the last message with role ``user`` (chat messages, Responses input or
    Anthropic messages; Anthropic's tool results are not the user's); a plain string is the
    user's text itself."""
    if isinstance(messages, str):
        return messages
    if not isinstance(messages, list | tuple):
        return ""
    index = _last_user_index(messages)
    return "" if index is None else text_of(messages[index].get("content"))


def has_user_message(messages) -> bool:
    """Whether the user said anything, in text or not (an image alone); a system or
    developer message alone is no user's."""
    if isinstance(messages, str):
        return bool(messages)
    return isinstance(messages, list | tuple) and _last_user_index(messages) is not None


def answers_tools(messages) -> bool:
    """Whether tool results follow the user's last message: the next step of a tool loop,
    whose question the step that asked it already sent."""
    if not isinstance(messages, list | tuple):
        return False
    index = _last_user_index(messages)
    return any(is_tool_result(m) for m in messages[0 if index is None else index + 1 :])


def _when(message: dict):
    """A message's time to order by: its ``created_at`` read as a time ("10:00:00Z", a whole
    second, sorted as text after "10:00:00.4Z": code review), as text if it is none."""
    stamp = message["created_at"]  # (none: not a context of memsvc's shape, as before)
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except (AttributeError, TypeError, ValueError):
        return (1, None, str(stamp))
    return (0, when if when.tzinfo else when.replace(tzinfo=UTC), "")


def format_context(context: dict) -> str | None:
    """The seed's format: memory blocks, then the relevant long-term memories (best first),
    then the relevant past messages in time order. None when there is nothing to say."""
    sections = []
    blocks = context.get("memory_blocks") or []
    if blocks:
        sections.append(
            "## Memory\n\n" + "\n\n".join(f"### {b['label']}\n{b['value']}" for b in blocks)
        )
    memories = context.get("memories") or []  # absent from older servers' answers
    if memories:
        sections.append(
            "## Memories\n\n"
            + "\n".join(f"- {shortened(m['content'], MAX_CONTEXT_MESSAGE_CHARS)}" for m in memories)
        )
    messages = sorted(context.get("relevant_messages") or [], key=_when)
    if messages:
        lines = [
            f"**{m['role'].capitalize()}**: {shortened(m['content'], MAX_CONTEXT_MESSAGE_CHARS)}"
            for m in messages
        ]
        sections.append("## Relevant Past Conversations\n\n" + "\n\n".join(lines))
    if not sections:
        return None
    return CONTEXT_HEADER + "\n\n" + "\n\n".join(sections)


def inject(messages: list, context_text: str) -> list:
    """A copy of ``messages`` with the context as a system message: right after a leading
    system (or developer) message, else first."""
    injected = {"role": "system", "content": context_text}
    messages = list(messages)
    first = messages[0] if messages else None
    if isinstance(first, dict) and first.get("role") in ("system", "developer"):
        return [first, injected, *messages[1:]]
    return [injected, *messages]


def append_text(instructions, text: str):
    """``text`` after existing instructions: a string (Responses ``instructions``, Anthropic
    ``system``) or a list of text blocks (Anthropic ``system``); ``text`` alone when none."""
    if isinstance(instructions, list):
        return [*instructions, {"type": "text", "text": text}]
    return f"{instructions}\n\n{text}" if instructions else text
