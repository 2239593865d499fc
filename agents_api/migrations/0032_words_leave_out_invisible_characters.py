"""Memories and tool records read by the words index as messages are (``conversations``
migration 0015): a word with an invisible character inside it as the word it shows."""

import django.contrib.postgres.indexes
from django.db import migrations, models
from django.db.models.functions import Cast, Left

from memsvc.db import words_column, words_column_replaced


class Migration(migrations.Migration):
    dependencies = [
        ("agents_api", "0031_user_erasure_conversations"),
        ("conversations", "0015_words_leave_out_invisible_characters"),
    ]

    operations = [
        *words_column_replaced(
            "memory",
            words_column("content", models.Value(" "), "summary"),
            django.contrib.postgres.indexes.GinIndex(
                fields=["agent", "user_id", "search_vector"],
                name="memory_scope_words",
                fastupdate=False,
            ),
        ),
        *words_column_replaced(
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
        ),
    ]
