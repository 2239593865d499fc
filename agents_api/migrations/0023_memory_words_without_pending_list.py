"""The words index of memories (``memory_scope_words``) without GIN's pending list
(``fastupdate = off``), as messages' (conversations 0008): every keyword search of a store
read the whole list, and the list's size swung PostgreSQL from the index to walking the
store's rows (docs/benchmarks.md, "GIN's pending list"). A save writes its words into the
index."""

import django.contrib.postgres.indexes
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("agents_api", "0022_memory_listing_scope"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    "ALTER INDEX memory_scope_words SET (fastupdate = off);"
                    " SELECT gin_clean_pending_list('memory_scope_words');",
                    reverse_sql="ALTER INDEX memory_scope_words RESET (fastupdate);",
                ),
            ],
            state_operations=[
                migrations.RemoveIndex(model_name="memory", name="memory_scope_words"),
                migrations.AddIndex(
                    model_name="memory",
                    index=django.contrib.postgres.indexes.GinIndex(
                        fields=["agent", "user_id", "search_vector"],
                        name="memory_scope_words",
                        fastupdate=False,
                    ),
                ),
            ],
        ),
    ]
