"""An index of memories by agent and expiry, for whether an agent keeps a live memory at all
(``selectors.keeps_live_memory_sql``), built without holding writes to the table."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # (CREATE INDEX CONCURRENTLY runs outside a transaction)

    dependencies = [
        ("agents_api", "0040_idempotent_request_moved_to_memsvc"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="memory",
            index=models.Index(fields=["agent", "expires_at"], name="memory_agent_expiry"),
        ),
    ]
