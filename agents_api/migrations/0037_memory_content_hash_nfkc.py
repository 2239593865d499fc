"""Memories' ``content_hash`` of the text as ``normalised_content`` reads it now (NFKC, what
draws nothing left out). Only a text that is not ASCII can read otherwise. Two memories of an
agent about a user that are one fact by the new reading keep their two rows: the later one
keeps its old hash (a merge is the save's to make, with its rules on importance and tags)."""

from django.db import migrations


def rehash(apps, schema_editor):
    from agents_api.models import content_hash

    Memory = apps.get_model("agents_api", "Memory")
    rows = Memory.objects.filter(content__regex=r"[^\x01-\x7f]").order_by("id")
    for memory in rows.only("id", "agent_id", "user_id", "content", "content_hash").iterator():
        hashed = content_hash(memory.content)
        if hashed == memory.content_hash:
            continue
        taken = Memory.objects.filter(
            agent_id=memory.agent_id, user_id=memory.user_id, content_hash=hashed
        ).exists()
        if not taken:
            Memory.objects.filter(pk=memory.pk).update(content_hash=hashed)


class Migration(migrations.Migration):
    dependencies = [
        ("agents_api", "0036_old_processes_insert_blocks_and_extractions"),
    ]

    operations = [migrations.RunPython(rehash, migrations.RunPython.noop, elidable=True)]
