from django.urls import path

from agents_api.api import data_rights, memories, tool_records, views

urlpatterns = [
    path("me", views.MeView.as_view()),
    path("conversations", views.ConversationsView.as_view()),
    path("conversations/<id:conversation_id>/messages", views.MessagesView.as_view()),
    path("conversations/<id:conversation_id>/context", views.ContextView.as_view()),
    path("conversations/<id:conversation_id>/summaries", views.SummariesView.as_view()),
    path("search/messages", views.SearchView.as_view()),
    path("memories", memories.AgentMemoriesView.as_view()),
    path("memories/batch", memories.AgentMemoryBatchView.as_view()),
    path("memories/search", memories.AgentMemorySearchView.as_view()),
    path("memories/<id:memory_id>", memories.AgentMemoryView.as_view()),
    path("tool-records", tool_records.ToolRecordsView.as_view()),
    path("tool-records/search", tool_records.ToolRecordSearchView.as_view()),
    path("tool-records/<id:trace_id>", tool_records.ToolRecordView.as_view()),
    path("memory-blocks", views.MemoryBlocksView.as_view()),
    path("memory-blocks/<str:label>", views.MemoryBlockView.as_view()),
    path("memory-blocks/<str:label>/revisions", views.MemoryBlockRevisionsView.as_view()),
    path("export", data_rights.AgentExportView.as_view()),
    path("import", data_rights.AgentImportView.as_view()),
]
