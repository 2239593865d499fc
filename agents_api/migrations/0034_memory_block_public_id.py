"""A memory block's public id (the local API's ``id``, a uuid as the seed gives one): added
empty, filled for the blocks there are, then required and unique."""

import uuid

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agents_api", "0033_memory_extraction_unread"),
    ]

    operations = [
        migrations.AddField(
            model_name="memoryblock",
            name="public_id",
            field=models.UUIDField(editable=False, null=True),
        ),
        migrations.RunSQL(
            "UPDATE memory_block SET public_id = gen_random_uuid() WHERE public_id IS NULL",
            reverse_sql=migrations.RunSQL.noop,
        ),
        migrations.AlterField(
            model_name="memoryblock",
            name="public_id",
            field=models.UUIDField(default=uuid.uuid4, editable=False, unique=True),
        ),
    ]
