"""``conversation.seen_at``: the latest change of a conversation that its users see, which
their lists are ordered by and show as ``updatedAt`` (``updated_at`` moves with agent-only
turns too, which users cannot read). A conversation stored before starts from its
``updated_at``: what users were shown until now."""

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0008_message_words_without_pending_list"),
    ]

    operations = [
        migrations.AddField(
            model_name="conversation",
            name="seen_at",
            field=models.DateTimeField(default=django.utils.timezone.now),
        ),
        migrations.RunSQL(
            "UPDATE conversation SET seen_at = updated_at",
            reverse_sql=migrations.RunSQL.noop,
        ),
        migrations.AddIndex(
            model_name="conversation",
            index=models.Index(fields=["-seen_at", "id"], name="conversation_seen"),
        ),
    ]
