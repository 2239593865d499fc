"""The part of ``/v1/user`` that the agents app serves: what agents keep about the user, and
the user's data rights (export, erase), which span both apps."""

from django.urls import path

from agents_api.api import data_rights, memories

urlpatterns = [
    path("memories", memories.UserMemoriesView.as_view()),
    path("memories/search", memories.UserMemorySearchView.as_view()),
    path("memories/<id:memory_id>", memories.UserMemoryView.as_view()),
    path("memory-setting", memories.UserMemorySettingView.as_view()),
    path("export", data_rights.UserExportView.as_view()),
    path("erase", data_rights.UserEraseView.as_view()),
]
