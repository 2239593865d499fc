from django.urls import path

from conversations.api import views

urlpatterns = [
    path("conversations", views.ConversationsView.as_view()),
    path("conversations/<uuid:conversation_id>", views.ConversationView.as_view()),
    path("conversations/<uuid:conversation_id>/messages", views.MessagesView.as_view()),
    path(
        "conversations/<uuid:conversation_id>/messages/<uuid:message_id>/fork",
        views.ForkView.as_view(),
    ),
    path("conversations/<uuid:conversation_id>/forks", views.ForksView.as_view()),
    path("conversations/<uuid:conversation_id>/memberships", views.MembershipsView.as_view()),
    path(
        # (A path: a user id may hold "/", an identity provider's ``sub``.)
        "conversations/<uuid:conversation_id>/memberships/<path:user_id>",
        views.MembershipView.as_view(),
    ),
    path(
        "conversations/<uuid:conversation_id>/transfer-ownership",
        views.TransferOwnershipView.as_view(),
    ),
    path("search/messages", views.SearchView.as_view()),
    path("ownership-transfers", views.TransfersView.as_view()),
    path("ownership-transfers/<uuid:transfer_id>", views.TransferView.as_view()),
    path("ownership-transfers/<uuid:transfer_id>/accept", views.AcceptTransferView.as_view()),
    path("ownership-transfers/<uuid:transfer_id>/decline", views.DeclineTransferView.as_view()),
]
