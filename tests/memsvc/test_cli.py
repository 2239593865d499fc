import time

import jwt

from memsvc import cli


def test_token_prints_a_local_jwt_for_the_user(capsys, settings):
    assert cli.main(["token", "alice", "--ttl", "120"]) == 0
    token = capsys.readouterr().out.strip()
    claims = jwt.decode(token, settings.MEMSVC_JWT_SECRET, algorithms=["HS256"])
    assert claims["sub"] == "alice"
    assert 110 <= claims["exp"] - time.time() <= 121
