"""The memory pages: per agent that serves the user, the memory blocks about them (view,
edit, revisions) and the long-term memories about them (search, delete one, clear all), and
the user's memory switch. On ``agents_api.selectors`` and ``agents_api.services``, as
``/v1/user/memories`` is."""

from django.contrib import messages as flash
from django.shortcuts import redirect, render

from agents_api import selectors, services
from agents_api.api import serializers as s
from memsvc.api.errors import one_or_404
from memsvc.api.fields import InputSerializer, TextField
from memsvc.pages.views.common import (
    PAGE_SIZE,
    action,
    back,
    fields_named,
    form_fields,
    names_shown,
    page,
)
from memsvc.text import shows_nothing

SEARCH_RESULTS = 20
# The newest revisions of each block shown beside it (the API pages through all of them).
REVISIONS_SHOWN = 20


def _agent(request, agent_id):
    """The agent a page names, if it serves the person (``agents_serving``): 404 otherwise,
    so a page never tells the name of an agent that keeps nothing about them."""
    return one_or_404(selectors.agents_serving(request.principal), agent_id, "Agent")


@page
def overview(request):
    user_id = request.principal.id
    context = {
        "agents": selectors.agents_serving(request.principal),
        "memory_enabled": selectors.memory_enabled_for(user_id),
        # What "delete every memory" deletes (``memories_clear``): the expired too, which no
        # list shows but which the prune gives a new life when they were used often.
        "memories_stored": selectors.memories_of(user_id=user_id, with_expired=True).exists(),
    }
    return render(request, "pages/memory.html", context)


@action
def switch(request):
    enabled = request.POST.get("enabled") == "on"
    services.memory_setting_update(request.principal, enabled=enabled)
    flash.success(request, "Memory turned on." if enabled else "Memory turned off.")
    return back(request, "pages:memory")


SEARCH_MEMORIES = "Search memories"  # (the search box's label)


@page(q=SEARCH_MEMORIES)
def agent_memory(request, agent_id):
    """One agent's memory about the user; ``?q=`` searches the memories, ``?after=`` pages
    them (htmx asks for just the results or the next page)."""
    agent = _agent(request, agent_id)
    user_id = request.principal.id
    query = request.GET.get("q", "")
    context = {
        "agent": agent,
        "query": query,
        "memory_enabled": selectors.memory_enabled_for(user_id),
    }
    if not shows_nothing(query):
        with fields_named(query=SEARCH_MEMORIES):
            data = s.UserSearchMemoriesIn.parse({"query": query, "limit": SEARCH_RESULTS})
        context["hits"] = selectors.memory_search(
            agent,
            user_id=user_id,
            query=data["query"],
            limit=data["limit"],
            min_score=data["minScore"],
            mode=data["mode"],
            exclusions=True,
        )
    elif query:
        context["hits"] = []  # only spaces: nothing to look for (as the conversations' search)
    if "hits" in context and request.htmx:
        return render(request, "pages/_memory_hits.html", context)
    context["memories"] = selectors.memory_page(
        request.principal,
        agent,
        user_id=user_id,
        order="recent",
        after=request.GET.get("after") or None,
        limit=PAGE_SIZE,
    )
    if request.htmx:  # the next page of memories
        return render(request, "pages/_memory_rows.html", context)
    # (As on the overview: the expired too.)
    context["memories_stored"] = selectors.memories_of(
        agent, user_id=user_id, with_expired=True
    ).exists()
    context["blocks"] = [
        (
            block,
            selectors.memory_block_revision_page(block, after=None, limit=REVISIONS_SHOWN).rows,
        )
        for block in selectors.memory_blocks(agent, user_id=user_id)
    ]
    revisions = [revision for _, rows in context["blocks"] for revision in rows]
    names = names_shown(revision.actor_principal for revision in revisions)
    for revision in revisions:
        revision.shown_as = names[revision.actor_principal]
    return render(request, "pages/agent.html", context)


class BlockIn(InputSerializer):
    # The block a form is about (``urls``: in the form, not in its address), as it is
    # labelled.
    label = TextField()


@action
def block_update(request, agent_id):
    agent = _agent(request, agent_id)
    label = BlockIn.parse(form_fields(request, "label"))["label"]
    block = selectors.memory_block(agent, user_id=request.principal.id, label=label)
    # (No value sent is refused, as by the API's PUT: it emptied the block; review.)
    with fields_named(value="Value"):
        data = s.PutMemoryBlockIn.parse(form_fields(request, "value"))
        services.memory_block_update(request.principal, block=block, value=data["value"])
    flash.success(request, f"The block {label} was saved.")
    return redirect("pages:agent_memory", agent.id)


@action
def memory_delete(request, memory_id):
    mine = selectors.memories_of(user_id=request.principal.id, with_expired=True)
    memory = selectors.memory_of(mine, memory_id)
    services.memory_delete(request.principal, memory=memory)
    if request.htmx:
        return render(request, "pages/_deleted.html", {"memory_id": memory_id})
    flash.success(request, "The memory was deleted.")
    return back(request, "pages:memory")


@action
def memories_clear(request, agent_id=None):
    agent = _agent(request, agent_id) if agent_id else None
    memories = selectors.memories_of(agent, user_id=request.principal.id, with_expired=True)
    deleted = services.memories_delete(request.principal, memories=memories)
    flash.success(request, f"{deleted} {'memory' if deleted == 1 else 'memories'} deleted.")
    if agent is not None and selectors.agents_serving(request.principal).filter(id=agent.id):
        return redirect("pages:agent_memory", agent.id)
    return redirect("pages:memory")  # it kept nothing else about them
