import django.db.models.deletion
from django.db import migrations, models

from memsvc.db import foreign_key_unindexed


class Migration(migrations.Migration):
    """Two foreign keys whose own index repeats the first column of another: one index fewer
    for each write. (Django's ``AlterField`` would also have dropped
    ``membership_one_owner_per_group``: ``foreign_key_unindexed``.)"""

    atomic = False  # (``DROP INDEX CONCURRENTLY``)

    dependencies = [
        ("conversations", "0006_message_author"),
    ]

    operations = [
        foreign_key_unindexed(
            "conversation",
            "group",
            models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="conversations",
                to="conversations.conversationgroup",
            ),
            table="conversation",
            index="conversation_group_id_f8fee04d",
        ),
        foreign_key_unindexed(
            "membership",
            "group",
            models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="memberships",
                to="conversations.conversationgroup",
            ),
            table="membership",
            index="membership_group_id_786fce67",
        ),
    ]
