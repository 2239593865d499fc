"""Exactly one owner per conversation group, checked when the transaction commits.

"At most one" is the partial unique index ``membership_one_owner_per_group``. "At least one"
cannot be a plain constraint: a group is created before its owner's membership, and an
ownership transfer demotes the old owner before it promotes the new one. So deferred
constraint triggers check, at commit, every group that a statement touched: a group that
still exists must have exactly one owner.
"""

from django.db import migrations

CREATE = """
CREATE FUNCTION conversation_group_check_owner() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    gid uuid;
    owners integer;
BEGIN
    IF TG_TABLE_NAME = 'conversation_group' THEN
        gid := NEW.id;
    ELSIF TG_OP = 'DELETE' THEN
        gid := OLD.group_id;
    ELSE
        gid := NEW.group_id;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM conversation_group WHERE id = gid) THEN
        RETURN NULL;  -- the group itself is gone
    END IF;
    SELECT count(*) INTO owners FROM membership WHERE group_id = gid AND access_level = 'owner';
    IF owners <> 1 THEN
        RAISE EXCEPTION 'conversation group % must have exactly one owner, has %', gid, owners
            USING ERRCODE = 'integrity_constraint_violation',
                  CONSTRAINT = 'conversation_group_one_owner';
    END IF;
    RETURN NULL;
END;
$$;

CREATE CONSTRAINT TRIGGER conversation_group_has_owner
    AFTER INSERT ON conversation_group
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION conversation_group_check_owner();

CREATE CONSTRAINT TRIGGER membership_keeps_group_owner
    AFTER INSERT OR UPDATE OF access_level, group_id OR DELETE ON membership
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION conversation_group_check_owner();
"""

DROP = """
DROP TRIGGER membership_keeps_group_owner ON membership;
DROP TRIGGER conversation_group_has_owner ON conversation_group;
DROP FUNCTION conversation_group_check_owner();
"""


class Migration(migrations.Migration):
    dependencies = [("conversations", "0001_initial")]

    operations = [migrations.RunSQL(CREATE, reverse_sql=DROP)]
