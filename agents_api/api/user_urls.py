"""The part of ``/v1/user`` that the agents app serves: what agents keep about the user."""

from django.urls import path

from agents_api.api import memories

urlpatterns = [
    path("memories", memories.UserMemoriesView.as_view()),
    path("memories/search", memories.UserMemorySearchView.as_view()),
    path("memories/<uuid:memory_id>", memories.UserMemoryView.as_view()),
]
