"""An index of memberships by principal and creation, for the conversation list's walk
(``selectors.activity_page``), built without holding writes to the table."""

from django.db import migrations, models

from memsvc.db import index_added_concurrently


class Migration(migrations.Migration):
    atomic = False  # (CREATE INDEX CONCURRENTLY runs outside a transaction)

    dependencies = [
        ("conversations", "0012_words_read_markup_as_text"),
    ]

    operations = index_added_concurrently(
        "membership",
        models.Index(fields=["principal_id", "created_at"], name="membership_principal_joined"),
    )
