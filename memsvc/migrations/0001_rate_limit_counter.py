from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="RateLimitCounter",
            fields=[
                ("bucket", models.CharField(max_length=400, primary_key=True, serialize=False)),
                ("window_start", models.BigIntegerField()),
                ("hits", models.IntegerField()),
            ],
            options={
                "db_table": "rate_limit_counter",
            },
        ),
        # Counts are worth no WAL: a crash may lose them (the table comes back empty).
        migrations.RunSQL(
            "ALTER TABLE rate_limit_counter SET UNLOGGED",
            "ALTER TABLE rate_limit_counter SET LOGGED",
        ),
    ]
