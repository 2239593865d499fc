from django.db import migrations

from memsvc.db import foreign_key_unindexed


class Migration(migrations.Migration):
    """Two foreign keys whose own index repeats the first column of another: one index fewer
    for each write. (Django's ``AlterField`` would also have dropped
    ``membership_one_owner_per_group``: ``foreign_key_unindexed``.)"""

    dependencies = [
        ("conversations", "0006_message_author"),
    ]

    operations = [
        foreign_key_unindexed(
            "conversation",
            "group",
            to="conversations.conversationgroup",
            related_name="conversations",
            table="conversation",
            index="conversation_group_id_f8fee04d",
        ),
        foreign_key_unindexed(
            "membership",
            "group",
            to="conversations.conversationgroup",
            related_name="memberships",
            table="membership",
            index="membership_group_id_786fce67",
        ),
    ]
