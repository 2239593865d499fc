from django.urls import path

from memsvc.pages.views import accounts, conversations, memory

app_name = "pages"


urlpatterns = [
    path(
        "login/",
        accounts.LoginView.as_view(),
        name="login",
    ),
    path("logout/", accounts.LogoutView.as_view(), name="logout"),
    path("", conversations.home, name="home"),
    path("search/", conversations.search, name="search"),
    path("conversations/new", conversations.conversation_create, name="conversation_create"),
    path("c/<id:conversation_id>/", conversations.conversation, name="conversation"),
    path("c/<id:conversation_id>/messages", conversations.message_append, name="append"),
    path(
        "c/<id:conversation_id>/messages/<id:message_id>/fork",
        conversations.fork,
        name="fork",
    ),
    path("c/<id:conversation_id>/reply", conversations.reply, name="reply"),
    path("c/<id:conversation_id>/rename", conversations.rename, name="rename"),
    path("c/<id:conversation_id>/delete", conversations.delete, name="delete"),
    path("c/<id:conversation_id>/members", conversations.share, name="share"),
    # The member a form is about is named in the form, not in its address: a browser drops
    # the dot segments of an address ("." and "..", "%2E" too), and some ids are just that.
    path(
        "c/<id:conversation_id>/members/level",
        conversations.membership_update,
        name="membership_update",
    ),
    path(
        "c/<id:conversation_id>/members/remove",
        conversations.membership_delete,
        name="membership_delete",
    ),
    path("c/<id:conversation_id>/transfer", conversations.transfer, name="transfer"),
    path(
        "transfers/<id:transfer_id>/<str:verb>",
        conversations.transfer_resolve,
        name="transfer_resolve",
    ),
    path("memory/", memory.overview, name="memory"),
    path("memory/switch", memory.switch, name="memory_switch"),
    path("memory/clear", memory.memories_clear, name="memories_clear_all"),
    path("memory/<id:agent_id>/", memory.agent_memory, name="agent_memory"),
    path("memory/<id:agent_id>/clear", memory.memories_clear, name="memories_clear"),
    # A block's label in the form, as a member's id above.
    path("memory/<id:agent_id>/blocks", memory.block_update, name="block_update"),
    path("memories/<id:memory_id>/delete", memory.memory_delete, name="memory_delete"),
]
