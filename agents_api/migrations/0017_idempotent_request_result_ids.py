from django.db import migrations


class Migration(migrations.Migration):
    """A key's record holds the ids of whatever its request wrote: messages, or tool
    records (a rename: the column's values stay as they are)."""

    dependencies = [
        ("agents_api", "0016_tool_record_user_outlives_conversation"),
    ]

    operations = [
        migrations.RenameField(
            model_name="idempotentrequest", old_name="message_ids", new_name="result_ids"
        ),
    ]
