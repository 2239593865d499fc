"""An index of memories by agent and expiry, for whether an agent keeps a live memory at all
(``selectors.keeps_live_memory_sql``), built without holding writes to the table."""

from django.db import migrations, models

from memsvc.db import index_added_concurrently


class Migration(migrations.Migration):
    atomic = False  # (CREATE INDEX CONCURRENTLY runs outside a transaction)

    dependencies = [
        ("agents_api", "0040_idempotent_request_moved_to_memsvc"),
    ]

    operations = index_added_concurrently(
        "memory", models.Index(fields=["agent", "expires_at"], name="memory_agent_expiry")
    )
