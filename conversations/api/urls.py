from django.urls import path

from conversations.api import views

urlpatterns = [
    path("conversations", views.ConversationsView.as_view()),
    path("conversations/<id:conversation_id>", views.ConversationView.as_view()),
    path("conversations/<id:conversation_id>/messages", views.MessagesView.as_view()),
    path(
        "conversations/<id:conversation_id>/messages/<id:message_id>/fork",
        views.ForkView.as_view(),
    ),
    path("conversations/<id:conversation_id>/forks", views.ForksView.as_view()),
    path("conversations/<id:conversation_id>/memberships", views.MembershipsView.as_view()),
    path(
        # (A path: a user id may hold "/", an identity provider's ``sub``.)
        "conversations/<id:conversation_id>/memberships/<path:user_id>",
        views.MembershipView.as_view(),
    ),
    path(
        "conversations/<id:conversation_id>/transfer-ownership",
        views.TransferOwnershipView.as_view(),
    ),
    path("search/messages", views.SearchView.as_view()),
    path("ownership-transfers", views.TransfersView.as_view()),
    path("ownership-transfers/<id:transfer_id>", views.TransferView.as_view()),
    path("ownership-transfers/<id:transfer_id>/accept", views.AcceptTransferView.as_view()),
    path("ownership-transfers/<id:transfer_id>/decline", views.DeclineTransferView.as_view()),
]
