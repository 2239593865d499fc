from django.db import migrations, models


class Migration(migrations.Migration):
    """Listings of walks by popularity marked with the list they walk: each list keeps its
    newest few (a listing per first page filled the disk)."""

    dependencies = [
        ("agents_api", "0021_foreign_keys_indexed_by_their_composites"),
    ]

    operations = [
        migrations.AddField(
            model_name="memorylisting",
            name="scope",
            field=models.CharField(default="", max_length=64),
        ),
        migrations.AddIndex(
            model_name="memorylisting",
            index=models.Index(fields=["scope", "created_at"], name="memory_listing_scope"),
        ),
    ]
