import django.db.models.deletion
from django.db import migrations, models

from memsvc.db import foreign_key_unindexed


class Migration(migrations.Migration):
    """Three foreign keys whose own index repeats the first column of another: one index
    fewer for each write (a memory's insert updates a dozen)."""

    atomic = False  # (``DROP INDEX CONCURRENTLY``)

    dependencies = [
        ("agents_api", "0020_memory_scope_words"),
    ]

    operations = [
        foreign_key_unindexed(
            "memory",
            "agent",
            models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="memories",
                to="agents_api.agent",
            ),
            table="memory",
            index="memory_agent_id_9cf5be2f",
        ),
        foreign_key_unindexed(
            "memoryblockrevision",
            "block",
            models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="revisions",
                to="agents_api.memoryblock",
            ),
            table="memory_block_revision",
            index="memory_block_revision_block_id_f1ce3e63",
        ),
        foreign_key_unindexed(
            "toolrecord",
            "agent",
            models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="tool_records",
                to="agents_api.agent",
            ),
            table="tool_record",
            index="tool_record_agent_id_67b4700a",
        ),
    ]
