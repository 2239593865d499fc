"""A memory's words indexed under its agent and user (``Memory.Meta.indexes``,
``memory_scope_words``): ``btree_gin`` lets one GIN index hold the scope's columns beside the
full-text vector, and it serves every search of the words alone as the old index did."""

import django.contrib.postgres.indexes
from django.contrib.postgres.operations import BtreeGinExtension
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("agents_api", "0019_memory_block_waiting_holds_no_label"),
    ]

    operations = [
        BtreeGinExtension(),
        migrations.AddIndex(
            model_name="memory",
            index=django.contrib.postgres.indexes.GinIndex(
                fields=["agent", "user_id", "search_vector"], name="memory_scope_words"
            ),
        ),
        migrations.RemoveIndex(model_name="memory", name="memory_search_vector"),
    ]
