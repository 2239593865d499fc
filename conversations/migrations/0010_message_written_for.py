"""``message.written_for``: the user whose turn an agent recorded. Their export and erase
found such a turn only while they were a member of its conversation: one removed (or who
left) kept their words there after an erase. Stored turns get it by the rule the export
used until now, narrowed to those who may write: a user turn an agent wrote, signed with the
id of a member of its group who is a writer (or above)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0009_conversation_seen_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="message",
            name="written_for",
            field=models.CharField(blank=True, default="", max_length=255),
        ),
        migrations.RunSQL(
            """
            UPDATE message m SET written_for = m.author_name
            FROM conversation c, membership ms
            WHERE c.id = m.conversation_id AND ms.group_id = c.group_id
              AND ms.principal_id = m.author_name
              AND ms.access_level IN ('owner', 'manager', 'writer')
              AND m.role = 'user' AND m.author_principal LIKE 'agent:%'
              AND m.author_name NOT LIKE 'agent:%'
            """,
            reverse_sql=migrations.RunSQL.noop,
        ),
        migrations.AddIndex(
            model_name="message",
            index=models.Index(
                condition=models.Q(("written_for", ""), _negated=True),
                fields=["written_for"],
                name="message_written_for",
            ),
        ),
    ]
