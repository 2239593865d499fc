"""Memories and tool records read by the words index as messages are (``conversations``
migration 0015): a word with an invisible character inside it as the word it shows."""

import importlib

import django.contrib.postgres.indexes
from django.db import migrations, models
from django.db.models.functions import Cast, Left

from memsvc.db import words_column, words_column_replaced

memory = words_column_replaced(
    "memory",
    words_column("content", models.Value(" "), "summary"),
    django.contrib.postgres.indexes.GinIndex(
        fields=["agent", "user_id", "search_vector"],
        name="memory_scope_words",
        fastupdate=False,
    ),
)
tool_records = words_column_replaced(
    "toolrecord",
    words_column(
        "tool_name",
        models.Value(" "),
        "summary",
        models.Value(" "),
        Left(Cast("raw_output", output_field=models.TextField()), 100_000),
    ),
    django.contrib.postgres.indexes.GinIndex(
        fields=["search_vector"], name="tool_record_search_vector"
    ),
)
# Between the columns' drops and their return: migrated back, they come back under the old
# function, set here before conversations 0015 is migrated back (which sets it again). Going
# forward it is in place already.
_words = importlib.import_module(
    "conversations.migrations.0015_words_leave_out_invisible_characters"
)
the_function = migrations.RunSQL(_words.WORDS, reverse_sql=_words.UNDO)


class Migration(migrations.Migration):
    dependencies = [
        ("agents_api", "0031_user_erasure_conversations"),
        ("conversations", "0015_words_leave_out_invisible_characters"),
    ]

    operations = [
        # Migrated back alone (conversations still at 0015), the function its messages'
        # column was made with is set again last (review).
        migrations.RunSQL(migrations.RunSQL.noop, reverse_sql=_words.WORDS),
        *memory[:2],
        *tool_records[:2],
        the_function,
        *memory[2:],
        *tool_records[2:],
    ]
