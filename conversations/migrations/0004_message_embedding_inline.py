from django.db import migrations


class Migration(migrations.Migration):
    """Keep each message's vector in its row.

    pgvector's type is stored EXTERNAL: once a row passes ~2 kB (a 384-float vector is
    1.5 kB, so many messages do), PostgreSQL moves the vector to the TOAST table, and every
    distance computed to it costs a TOAST index lookup and a second heap read: an exact
    search over 1,000 messages spent two thirds of its time there. MAIN keeps the vector
    in the row and moves the text out first; only a vector too big for a page (over ~2,000
    dimensions) still goes out of line. Existing rows keep their storage until re-embedded.
    """

    dependencies = [
        ("conversations", "0003_message_indexes"),
    ]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE message ALTER COLUMN embedding SET STORAGE MAIN",
            reverse_sql="ALTER TABLE message ALTER COLUMN embedding SET STORAGE EXTERNAL",
        ),
    ]
