from django.db import migrations, models


def trust_existing_keyless_local_agents(apps, schema_editor):
    """Agents the local API made before this field existed: those of the local owner that
    have no key (``memsvc apikey create`` always makes one)."""
    Agent = apps.get_model("agents_api", "Agent")
    Agent.objects.filter(owner_principal="local", api_keys__isnull=True).update(
        loopback_trusted=True
    )


class Migration(migrations.Migration):
    dependencies = [
        ("agents_api", "0010_user_memory_setting"),
    ]

    operations = [
        migrations.AddField(
            model_name="agent",
            name="loopback_trusted",
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(trust_existing_keyless_local_agents, migrations.RunPython.noop),
    ]
