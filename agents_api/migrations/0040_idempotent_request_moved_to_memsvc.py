from django.db import migrations


def content_type_moved(apps, schema_editor):
    """The model's content type (and its permissions) follow it to memsvc: left here, the
    admin listed the permissions of both (code review). None on a new database; one of
    memsvc's already there (a migration run again) wins."""
    ContentType = apps.get_model("contenttypes", "ContentType")
    old = ContentType.objects.filter(app_label="agents_api", model="idempotentrequest")
    if ContentType.objects.filter(app_label="memsvc", model="idempotentrequest").exists():
        old.delete()
    else:
        old.update(app_label="memsvc")


def content_type_back(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    ContentType.objects.filter(app_label="memsvc", model="idempotentrequest").update(
        app_label="agents_api"
    )


class Migration(migrations.Migration):
    """The Idempotency-Keys' store is the service's own now (``memsvc`` 0002): the model
    leaves this app, its table stays."""

    dependencies = [
        ("agents_api", "0039_api_key_name_no_invisible_characters"),
        ("memsvc", "0002_idempotent_request"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="IdempotentRequest")],
        ),
        migrations.RunPython(content_type_moved, content_type_back),
    ]
