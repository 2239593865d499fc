import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    """The Idempotency-Keys of every API in one store, the service's own (it was the agents
    app's, whose migration 0002 made the table; the user API takes keys too now). The table
    stays as it is: only Django's idea of whose model it is moves
    (``agents_api`` 0040 lets go of it)."""

    dependencies = [
        ("memsvc", "0001_rate_limit_counter"),
        ("agents_api", "0039_api_key_name_no_invisible_characters"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="IdempotentRequest",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("principal_id", models.CharField(max_length=255)),
                        ("key", models.CharField(max_length=255)),
                        ("request_hash", models.CharField(max_length=64)),
                        ("result_ids", models.JSONField(default=list)),
                        (
                            "created_at",
                            models.DateTimeField(default=django.utils.timezone.now, editable=False),
                        ),
                    ],
                    options={
                        "db_table": "idempotent_request",
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("principal_id", "key"), name="idempotency_key_unique"
                            )
                        ],
                    },
                ),
            ],
        ),
    ]
