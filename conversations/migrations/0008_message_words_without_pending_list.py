"""The words index of messages (``message_search_vector``) without GIN's pending list
(``fastupdate = off``): every keyword search read the whole list, up to 4 MB of recent
entries unsorted, and the list's size swung PostgreSQL's choice of plan
(docs/benchmarks.md, "GIN's pending list"). An append now writes its words into the index."""

import django.contrib.postgres.indexes
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0007_foreign_keys_indexed_by_their_composites"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    "ALTER INDEX message_search_vector SET (fastupdate = off);"
                    " SELECT gin_clean_pending_list('message_search_vector');",
                    reverse_sql="ALTER INDEX message_search_vector RESET (fastupdate);",
                ),
            ],
            state_operations=[
                migrations.RemoveIndex(model_name="message", name="message_search_vector"),
                migrations.AddIndex(
                    model_name="message",
                    index=django.contrib.postgres.indexes.GinIndex(
                        fields=["search_vector"],
                        name="message_search_vector",
                        fastupdate=False,
                    ),
                ),
            ],
        ),
    ]
