from django.db import migrations

# Room on each heap page for the new version of a row whose use count grows: with it,
# ``memories_touch`` is a HOT update and writes no index entry (a memory row is about
# 2 kB: at fillfactor 70 a page keeps two and has room for a third version). Pages
# written before this migration fill up first; VACUUM FULL (offline) rewrites them.
FILLFACTOR = 70


class Migration(migrations.Migration):
    dependencies = [
        ("agents_api", "0007_memory_scope_index"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="memory", name="memory_popular"),
        migrations.RunSQL(
            f"ALTER TABLE memory SET (fillfactor = {FILLFACTOR})",
            reverse_sql="ALTER TABLE memory RESET (fillfactor)",
        ),
    ]
