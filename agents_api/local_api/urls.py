"""The seed's paths, at the root of the site."""

from django.urls import path

from agents_api.local_api import views

urlpatterns = [
    path("health", views.HealthView.as_view()),
    path("agents", views.AgentsView.as_view()),
    path("agents/<str:name>", views.AgentView.as_view()),
    path("messages", views.MessagesView.as_view()),
    path("messages/search", views.MessageSearchView.as_view()),
    path("messages/<str:agent_name>", views.AgentMessagesView.as_view()),
    path("memory-blocks", views.MemoryBlocksView.as_view()),
    path("memory-blocks/<str:agent_name>", views.AgentMemoryBlocksView.as_view()),
    path("memory-blocks/<str:agent_name>/<str:label>", views.MemoryBlockView.as_view()),
    path("context/<str:agent_name>", views.ContextView.as_view()),
    path("tool-records", views.ToolRecordsView.as_view()),
    path("tool-records/search", views.ToolRecordSearchView.as_view()),
]
