from django.db import migrations


class Migration(migrations.Migration):
    """Keep a message's vector and words in its row.

    By default PostgreSQL shrinks any row past ~2 kB, and a message with a 384-float vector
    (1.5 kB) often is: pgvector's type is stored EXTERNAL, so the vector went to the TOAST
    table, and every distance computed to it cost a TOAST index lookup and a second heap
    read (an exact search over 1,000 messages spent two thirds of its time there). Moving
    the tsvector out instead slows keyword scoring the same way.

    - ``toast_tuple_target``: rows up to half a page stay whole;
    - the vector's storage is MAIN: in a longer row the text goes out of line first, and
      only a vector too big for a page (over ~2,000 dimensions) still does.

    Existing rows keep their layout until they are next written.
    """

    dependencies = [
        ("conversations", "0003_message_indexes"),
    ]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE message ALTER COLUMN embedding SET STORAGE MAIN",
            reverse_sql="ALTER TABLE message ALTER COLUMN embedding SET STORAGE EXTERNAL",
        ),
        migrations.RunSQL(
            "ALTER TABLE message SET (toast_tuple_target = 4080)",
            reverse_sql="ALTER TABLE message RESET (toast_tuple_target)",
        ),
    ]
