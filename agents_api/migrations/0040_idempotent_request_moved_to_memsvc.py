from django.db import migrations


class Migration(migrations.Migration):
    """The Idempotency-Keys' store is the service's own now (``memsvc`` 0002): the model
    leaves this app, its table stays."""

    dependencies = [
        ("agents_api", "0039_api_key_name_no_invisible_characters"),
        ("memsvc", "0002_idempotent_request"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="IdempotentRequest")],
        ),
    ]
