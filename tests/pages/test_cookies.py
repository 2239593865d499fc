"""The session and CSRF cookies: SameSite and HttpOnly always, Secure outside local mode."""

import pytest

from tests.memsvc.test_settings import run_django

COOKIE_SETTINGS = (
    "from django.conf import settings as s;"
    "print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SESSION_COOKIE_SAMESITE,"
    " s.CSRF_COOKIE_SAMESITE, s.SESSION_COOKIE_HTTPONLY, s.CSRF_COOKIE_HTTPONLY)"
)


@pytest.mark.parametrize(
    ("env", "secure"),
    [
        ({}, "False"),  # local mode: plain HTTP on loopback
        ({"DATABASE_URL": "postgres://x@127.0.0.1:1/x", "DJANGO_SECRET_KEY": "k"}, "True"),
        ({"MEMSVC_SECURE_COOKIES": "1"}, "True"),  # a local server behind HTTPS
    ],
    ids=["local", "production", "asked for"],
)
def test_cookie_settings(tmp_path, env, secure):
    result = run_django({"MEMSVC_DATA_DIR": str(tmp_path), **env}, COOKIE_SETTINGS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [secure, secure, "Lax", "Lax", "True", "True"]


def test_a_login_sets_samesite_httponly_cookies(client, alice_page):
    csrf = client.get("/app/login/").cookies["csrftoken"]
    assert csrf["samesite"] == "Lax" and csrf["httponly"] is True
    response = client.post(
        "/app/login/", {"username": "alice", "password": "a long enough password"}
    )
    session = response.cookies["sessionid"]
    assert session["samesite"] == "Lax" and session["httponly"] is True
