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


def test_behind_a_proxy_that_ends_tls_a_login_passes_the_csrf_check(tmp_path, alice_page):
    """A browser's form behind an HTTPS proxy has an https Origin; the request reaches Django
    as plain HTTP: without MEMSVC_PROXY_HTTPS every login there failed the CSRF check."""
    from django.test import Client, override_settings

    result = run_django(
        {"MEMSVC_DATA_DIR": str(tmp_path), "MEMSVC_PROXY_HTTPS": "1", "MEMSVC_HSTS_SECONDS": "60"},
        "from django.conf import settings as s; print(s.SECURE_PROXY_SSL_HEADER, s.SECURE_HSTS_SECONDS)",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["('HTTP_X_FORWARDED_PROTO',", "'https')", "60"]

    def login(browser: Client):
        token = browser.get("/app/login/", HTTP_X_FORWARDED_PROTO="https").cookies["csrftoken"]
        return browser.post(
            "/app/login/",
            {
                "username": "alice",
                "password": "a long enough password",
                "csrfmiddlewaretoken": token.value,
            },
            HTTP_ORIGIN="https://testserver",
            HTTP_HOST="testserver",  # as the proxy passes it on
            HTTP_X_FORWARDED_PROTO="https",
        )

    assert login(Client(enforce_csrf_checks=True)).status_code == 403
    with override_settings(
        SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO", "https"), SECURE_HSTS_SECONDS=60
    ):
        response = login(Client(enforce_csrf_checks=True))
        assert response.status_code == 302, response.content[:300]
        assert response["Strict-Transport-Security"] == "max-age=60"
