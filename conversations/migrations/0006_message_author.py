"""An index on ``message.author_principal``: a user's export and erase find their messages
through it (``selectors.messages_elsewhere``) instead of reading the whole table. Built
concurrently: appends go on meanwhile, however large the table."""

from django.db import migrations, models

from memsvc.db import index_added_concurrently


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("conversations", "0005_title_one_line"),
    ]

    operations = index_added_concurrently(
        "message", models.Index(fields=["author_principal"], name="message_author")
    )
