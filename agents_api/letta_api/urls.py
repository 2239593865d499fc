"""Letta's paths (``/v1/agents/...``, ``/v1/blocks/...``, ``/v1/groups/...``), beside memsvc's
own ``/v1/agent`` and ``/v1/user``. Any other path under Letta's prefixes answers 501."""

from django.urls import path, re_path

from agents_api.letta_api import views

# Letta's top-level resources: a path under one of them is Letta's, served or not.
LETTA_PREFIXES = (
    "agents|blocks|groups|tools|sources|folders|identities|runs|steps|archives|models"
    "|templates|batches|mcp-servers|tags|jobs|providers|embeddings|messages|voice-beta"
)

urlpatterns = [
    # The lists with or without the slash, as Letta's server takes them.
    re_path(r"^agents/?$", views.AgentsView.as_view()),
    path("agents/<str:agent_id>", views.AgentView.as_view()),
    path("agents/<str:agent_id>/messages", views.AgentMessagesView.as_view()),
    path("agents/<str:agent_id>/messages/capture", views.CaptureView.as_view()),
    path(
        "agents/<str:agent_id>/core-memory/blocks/attach/<str:block_id>",
        views.AttachBlockView.as_view(),
    ),
    path("groups/<str:group_id>", views.GroupView.as_view()),
    re_path(r"^blocks/?$", views.BlocksView.as_view()),
    path("blocks/<str:block_id>", views.BlockView.as_view()),
    re_path(rf"^(?:{LETTA_PREFIXES})(?:/[\s\S]*)?$", views.UnsupportedView.as_view()),
]
