"""JWT bearer authentication of the user API (``memsvc/api/jwt_auth.py``), end to end.

Every refusal is a 401 in the API's error shape with ``WWW-Authenticate: Bearer``, never a
500. Issuer (OIDC) tokens are checked against a key set served by a real HTTP server on
127.0.0.1.
"""

import base64
import hashlib
import hmac
import json
import socket
import time
import uuid

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from django.test import Client
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from memsvc.api.jwt_auth import KEY_SET_RETRY_SECONDS, _jwks_client
from memsvc.tokens import mint_user_token
from tests.local_http import LocalHttpServer, Reply

pytestmark = pytest.mark.django_db

PATH = "/v1/user/conversations"
SECRET = "test-shared-secret-for-hs256-tokens-" + "0123456789abcdef" * 2
ISSUER = "https://issuer.test"
AUDIENCE = "memsvc"

RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER_RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
RSA_KID = "rsa-1"
EC_KID = "ec-1"


# --- helpers ---------------------------------------------------------------------------------


def claims(**overrides) -> dict:
    """Valid claims for user ``alice``; an override of ``None`` removes the claim."""
    now = int(time.time())
    base = {"sub": "alice", "iat": now, "exp": now + 600}
    base.update(overrides)
    return {name: value for name, value in base.items() if value is not None}


def oidc_claims(**overrides) -> dict:
    return claims(**{"iss": ISSUER, "aud": AUDIENCE, **overrides})


def token(claims: dict, key, alg: str = "HS256", headers: dict | None = None) -> str:
    return jwt.encode(claims, key, algorithm=alg, headers=headers)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def hand_made_token(header: dict, claims: dict, sign=lambda signing_input: b"") -> str:
    """A token built without PyJWT, for what PyJWT refuses to sign (``none``, PEM secrets)."""
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
    return f"{signing_input}.{b64url(sign(signing_input.encode('ascii')))}"


def bearer(value: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {value}"}


def assert_unauthorized(response, message_contains: str | None = None) -> dict:
    assert response.status_code == 401, (
        f"expected a 401, got a {response.status_code}: {response.content[:300]!r}"
    )
    body = response.json()
    assert body == {"error": body["error"], "code": "unauthorized", "details": {}}
    assert isinstance(body["error"], str)
    assert body["error"]
    assert response["WWW-Authenticate"] == "Bearer"
    if message_contains is not None:
        assert message_contains in body["error"]
    return body


def assert_issuer_unavailable(response) -> None:
    """The issuer's key set could not be read: the service's outage (503), not the caller's
    bad token (a 401 counted against the address), and nothing of the fetch's error shown."""
    assert response.status_code == 503, response.content[:300]
    assert response.json() == {
        "error": "the token issuer's key set cannot be read; try again shortly",
        "code": "unavailable",
        "details": {},
    }


def assert_accepted(response) -> None:
    assert response.status_code == 200, (
        f"expected a 200, got a {response.status_code}: {response.content[:300]!r}"
    )
    assert response.json() == {"data": [], "nextCursor": None}


def owner_of_new_conversation(api, token_: str) -> str:
    response = api.post(PATH, {"title": "x"}, as_=bearer(token_))
    assert response.status_code == 201, response.content
    return response.json()["ownerUserId"]


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture
def client():
    """The test client, answering a server error with its 500 instead of raising it, so that
    "never a 500" is checked by the status code assertions (the ``api`` fixture uses it)."""
    return Client(raise_request_exception=False)


@pytest.fixture(autouse=True)
def jwt_settings(settings):
    """Local mode: HS256 tokens with ``SECRET``, no issuer, no audience, no key set."""
    settings.MEMSVC_JWT_SECRET = SECRET
    settings.MEMSVC_JWT_JWKS_URL = None
    settings.MEMSVC_JWT_ISSUER = None
    settings.MEMSVC_JWT_AUDIENCE = None
    return settings


class JwksServer(LocalHttpServer):
    """Serves ``document`` (a JSON object, or raw bytes) and counts the requests."""

    def __init__(self, document: dict | bytes):
        self.document = document
        super().__init__(lambda method, path, body: Reply(payload=self.document))
        self.url = f"{self.url}/.well-known/jwks.json"

    @property
    def request_count(self) -> int:
        return len(self.requests)


def public_jwk(public_key, algorithm, kid: str) -> dict:
    return {**algorithm.to_jwk(public_key, as_dict=True), "kid": kid, "use": "sig"}


@pytest.fixture
def jwks_server():
    document = {
        "keys": [
            public_jwk(RSA_KEY.public_key(), RSAAlgorithm, RSA_KID),
            public_jwk(EC_KEY.public_key(), ECAlgorithm, EC_KID),
        ]
    }
    with JwksServer(document) as server:
        yield server


@pytest.fixture
def oidc(jwt_settings, jwks_server):
    """An OIDC issuer's key set, issuer and audience; no shared secret."""
    jwt_settings.MEMSVC_JWT_SECRET = None
    jwt_settings.MEMSVC_JWT_JWKS_URL = jwks_server.url
    jwt_settings.MEMSVC_JWT_ISSUER = ISSUER
    jwt_settings.MEMSVC_JWT_AUDIENCE = AUDIENCE
    _jwks_client.cache_clear()
    yield jwks_server
    _jwks_client.cache_clear()


def rs256(claims: dict, kid: str | None = RSA_KID, key=RSA_KEY) -> str:
    return token(claims, key, "RS256", headers={"kid": kid} if kid else None)


def es256(claims: dict, kid: str = EC_KID) -> str:
    return token(claims, EC_KEY, "ES256", headers={"kid": kid})


# --- malformed Authorization headers ---------------------------------------------------------


def test_no_authorization_header(api):
    assert_unauthorized(api.get(PATH))


@pytest.mark.parametrize(
    "header",
    [
        "Basic abc",
        "Token abc",
        "Bearer",
        "Bearer ",
        "Bearer a b",
        "abc",
    ],
)
def test_malformed_authorization_header(api, header):
    assert_unauthorized(api.get(PATH, as_={"HTTP_AUTHORIZATION": header}))


@pytest.mark.parametrize(
    "value", ["garbage", "a.b.c", "....", "eyJhbGciOiJIUzI1NiJ9.e30.", "x" * 5000]
)
def test_garbage_token(api, value):
    assert_unauthorized(api.get(PATH, as_=bearer(value)))


def test_a_token_that_does_not_decode_is_refused_without_the_decoders_words(api):
    refused = assert_unauthorized(api.get(PATH, as_=bearer("abc.def.ghi")))
    assert refused["error"] == "invalid token: Invalid header string"  # (not "'utf-8' codec ...")


def test_non_ascii_token(api):
    # A WSGI/ASGI server hands headers over as latin-1 strings: UTF-8 "é" arrives as "Ã©".
    value = token(claims(), SECRET) + "é".encode().decode("latin-1")
    assert_unauthorized(api.get(PATH, as_=bearer(value)), "invalid token")


def test_api_key_is_refused_with_a_hint(api):
    assert_unauthorized(api.get(PATH, as_=bearer("msk_abc_def")), "user token")
    # Sent as the agent API takes it too (it said "credentials were not provided": review).
    as_agent = {"HTTP_X_API_KEY": "msk_abc_def"}
    assert_unauthorized(api.get(PATH, as_=as_agent), "the user API needs a user token")


# --- HS256 with the shared secret ------------------------------------------------------------


def test_hs256_token_is_accepted(api):
    assert_accepted(api.get(PATH, as_=bearer(token(claims(), SECRET))))


def test_minted_token_is_accepted(api, alice):
    assert_accepted(api.get(PATH, as_=alice))


def test_principal_is_the_sub_claim(api):
    assert owner_of_new_conversation(api, token(claims(sub="user-42@example.com"), SECRET)) == (
        "user-42@example.com"
    )


def test_expiry_has_a_30_second_leeway(api):
    assert_accepted(api.get(PATH, as_=bearer(token(claims(exp=int(time.time()) - 10), SECRET))))


def test_expired_token(api):
    expired = token(claims(exp=int(time.time()) - 120), SECRET)
    assert_unauthorized(api.get(PATH, as_=bearer(expired)), "expired")


def test_token_not_yet_valid(api):
    early = token(claims(nbf=int(time.time()) + 600), SECRET)
    assert_unauthorized(api.get(PATH, as_=bearer(early)))


@pytest.mark.parametrize("claim", ["exp", "sub"])
def test_required_claim_missing(api, claim):
    assert_unauthorized(api.get(PATH, as_=bearer(token(claims(**{claim: None}), SECRET))), claim)


@pytest.mark.parametrize("exp", ["tomorrow", [1], {"at": 1}, "9999999999", True])
def test_exp_not_a_number(api, exp):
    """(A text of digits was read as the number and taken; ``true`` said "token expired":
    reviews.)"""
    response = api.get(PATH, as_=bearer(token(claims(exp=exp), SECRET)))
    assert_unauthorized(response, "exp")
    assert "expired" not in response.json()["error"]


@pytest.mark.parametrize("claim", ["nbf", "iat"])
@pytest.mark.parametrize("kind", ["text", "bool"])
def test_other_times_are_numbers_too(api, claim, kind):
    now = str(int(time.time()) - 60) if kind == "text" else True
    assert_unauthorized(api.get(PATH, as_=bearer(token(claims(**{claim: now}), SECRET))), claim)


@pytest.mark.parametrize("sub", [42, "", ["alice"], {"id": "alice"}, True])
def test_sub_not_a_non_empty_string(api, sub):
    assert_unauthorized(api.get(PATH, as_=bearer(token(claims(sub=sub), SECRET))))


@pytest.mark.parametrize(
    ("sub", "problem"),
    [
        ("x" * 256, "must be at most 255 characters"),
        ("ali\x00ce", "must not contain NUL characters"),
        ("agent:1234", "must name a user, not an agent"),
        # (A 500 where the rate limit counted it, or where a query named it: review.)
        ("ali\ud800ce", "must not contain lone surrogate characters"),
    ],
)
def test_a_signed_sub_that_cannot_be_a_user_id_is_a_400(api, sub, problem):
    """The token is genuine, its ``sub`` is not an id this service can keep (issue 15): the
    request's fault, in the error shape, naming ``sub``; not a failed authentication."""
    response = api.get(PATH, as_=bearer(token(claims(sub=sub), SECRET)))
    assert response.status_code == 400, response.content[:300]
    assert response.json() == {
        "error": f"sub: {problem}",
        "code": "validation_error",
        "details": {"sub": [problem]},
    }


def test_json_null_sub(api):
    assert_unauthorized(api.get(PATH, as_=bearer(token({**claims(), "sub": None}, SECRET))))


def test_hs256_signed_with_another_secret(api):
    forged = token(claims(), "another-secret-of-sufficient-length-0123456789")
    assert_unauthorized(api.get(PATH, as_=bearer(forged)), "invalid token")


def test_tampered_payload(api):
    header, _, signature = token(claims(sub="alice"), SECRET).split(".")
    payload = b64url(json.dumps(claims(sub="bob")).encode())
    assert_unauthorized(api.get(PATH, as_=bearer(f"{header}.{payload}.{signature}")))


@pytest.mark.parametrize("alg", ["none", "None", "NONE", ""])
def test_unsigned_token(api, alg):
    unsigned = hand_made_token({"alg": alg, "typ": "JWT"}, claims())
    assert_unauthorized(api.get(PATH, as_=bearer(unsigned)))


def test_unsigned_token_made_by_pyjwt(api):
    assert_unauthorized(api.get(PATH, as_=bearer(token(claims(), None, "none"))))


def test_header_without_alg(api):
    assert_unauthorized(api.get(PATH, as_=bearer(hand_made_token({"typ": "JWT"}, claims()))))


@pytest.mark.parametrize("alg", ["HS384", "HS512"])
def test_other_hmac_algorithms_are_refused(api, alg):
    assert_unauthorized(api.get(PATH, as_=bearer(token(claims(), SECRET, alg))), alg)


def test_hs256_with_configured_issuer_and_audience(api, jwt_settings):
    jwt_settings.MEMSVC_JWT_ISSUER = ISSUER
    jwt_settings.MEMSVC_JWT_AUDIENCE = AUDIENCE
    assert_accepted(api.get(PATH, as_=bearer(token(oidc_claims(), SECRET))))
    assert_accepted(api.get(PATH, as_=bearer(mint_user_token("alice"))))
    assert_unauthorized(api.get(PATH, as_=bearer(token(claims(), SECRET))))
    assert_unauthorized(api.get(PATH, as_=bearer(token(oidc_claims(iss="https://x"), SECRET))))
    assert_unauthorized(api.get(PATH, as_=bearer(token(oidc_claims(aud="other"), SECRET))))


def test_no_secret_and_no_key_set_accepts_nothing(api, jwt_settings):
    jwt_settings.MEMSVC_JWT_SECRET = None
    assert_unauthorized(api.get(PATH, as_=bearer(token(claims(), SECRET))), "HS256")
    assert_unauthorized(api.get(PATH, as_=bearer(rs256(claims()))), "RS256")


def test_empty_secret_accepts_nothing(api, jwt_settings):
    jwt_settings.MEMSVC_JWT_SECRET = ""
    assert_unauthorized(api.get(PATH, as_=bearer(token(claims(), SECRET))), "HS256")


# --- OIDC: RS256/ES256 from the issuer's key set ----------------------------------------------


def test_rs256_token_from_the_issuer(api, oidc):
    assert_accepted(api.get(PATH, as_=bearer(rs256(oidc_claims()))))


@pytest.mark.parametrize("alg", ["RS384", "RS512"])
def test_rs384_and_rs512_tokens_verify_with_a_key_published_without_alg(api, oidc, alg):
    """The issuer's RSA key has no ``alg`` member (as many issuers publish them)."""
    assert "alg" not in oidc.document["keys"][0]
    assert_accepted(api.get(PATH, as_=bearer(token(oidc_claims(), RSA_KEY, alg, {"kid": RSA_KID}))))


def test_a_key_published_with_alg_verifies_that_algorithm_only(api, oidc):
    oidc.document["keys"][0]["alg"] = "RS256"
    signed = token(oidc_claims(), RSA_KEY, "RS384", {"kid": RSA_KID})
    assert_unauthorized(api.get(PATH, as_=bearer(signed)), "RS256")


def test_es256_token_from_the_issuer(api, oidc):
    assert_accepted(api.get(PATH, as_=bearer(es256(oidc_claims()))))


def test_issuer_token_principal_is_the_sub_claim(api, oidc):
    sub = "a1b2c3d4-0000-4000-8000-000000000001"
    assert owner_of_new_conversation(api, rs256(oidc_claims(sub=sub))) == sub


def test_issuer_token_with_wrong_audience(api, oidc):
    assert_unauthorized(api.get(PATH, as_=bearer(rs256(oidc_claims(aud="someone-else")))))


def test_issuer_token_without_audience(api, oidc):
    assert_unauthorized(api.get(PATH, as_=bearer(rs256(oidc_claims(aud=None)))))


def test_issuer_token_with_audience_list(api, oidc):
    assert_accepted(api.get(PATH, as_=bearer(rs256(oidc_claims(aud=["other", AUDIENCE])))))


def test_issuer_token_with_wrong_issuer(api, oidc):
    assert_unauthorized(api.get(PATH, as_=bearer(rs256(oidc_claims(iss="https://evil.test")))))


def test_issuer_token_without_issuer(api, oidc):
    assert_unauthorized(api.get(PATH, as_=bearer(rs256(oidc_claims(iss=None)))))


def test_expired_issuer_token(api, oidc):
    expired = rs256(oidc_claims(exp=int(time.time()) - 120))
    assert_unauthorized(api.get(PATH, as_=bearer(expired)), "expired")


@pytest.mark.parametrize("claim", ["exp", "sub"])
def test_issuer_token_without_required_claim(api, oidc, claim):
    assert_unauthorized(api.get(PATH, as_=bearer(rs256(oidc_claims(**{claim: None})))))


def test_issuer_token_signed_by_another_key_with_the_same_kid(api, oidc):
    forged = rs256(oidc_claims(), key=OTHER_RSA_KEY)
    assert_unauthorized(api.get(PATH, as_=bearer(forged)), "invalid token")


def test_issuer_token_with_unknown_kid(api, oidc):
    assert_unauthorized(api.get(PATH, as_=bearer(rs256(oidc_claims(), kid="unknown"))))


def test_issuer_token_without_kid(api, oidc):
    assert_unauthorized(api.get(PATH, as_=bearer(rs256(oidc_claims(), kid=None))))


def test_unsigned_token_with_a_known_kid(api, oidc):
    unsigned = hand_made_token({"alg": "none", "kid": RSA_KID}, oidc_claims())
    assert_unauthorized(api.get(PATH, as_=bearer(unsigned)))


def rsa_public_pems() -> list[bytes]:
    public_key = RSA_KEY.public_key()
    return [
        public_key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
        public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.PKCS1),
        public_key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH),
    ]


@pytest.mark.parametrize("public_key", rsa_public_pems())
@pytest.mark.parametrize("shared_secret", [None, SECRET])
def test_algorithm_confusion_hs256_signed_with_the_rsa_public_key(
    api, oidc, jwt_settings, public_key, shared_secret
):
    """The classic attack: HMAC over the token with the issuer's *public* key as secret."""
    jwt_settings.MEMSVC_JWT_SECRET = shared_secret
    forged = hand_made_token(
        {"alg": "HS256", "typ": "JWT", "kid": RSA_KID},
        oidc_claims(),
        lambda signing_input: hmac.new(public_key, signing_input, hashlib.sha256).digest(),
    )
    assert_unauthorized(api.get(PATH, as_=bearer(forged)))


def test_hs256_token_refused_when_only_the_issuer_is_configured(api, oidc):
    assert_unauthorized(api.get(PATH, as_=bearer(token(oidc_claims(), SECRET))), "HS256")


def test_shared_secret_and_issuer_together(api, oidc, jwt_settings):
    jwt_settings.MEMSVC_JWT_SECRET = SECRET
    assert_accepted(api.get(PATH, as_=bearer(token(oidc_claims(), SECRET))))
    assert_accepted(api.get(PATH, as_=bearer(rs256(oidc_claims()))))


def test_key_set_is_fetched_once_and_cached(api, oidc):
    for _ in range(3):
        assert_accepted(api.get(PATH, as_=bearer(rs256(oidc_claims()))))
        assert_accepted(api.get(PATH, as_=bearer(es256(oidc_claims()))))
    assert oidc.request_count == 1


def test_unknown_kids_do_not_refetch_the_key_set_every_time(api, oidc):
    """A flood of made-up ``kid``s must not turn into a flood of requests to the issuer."""
    assert_accepted(api.get(PATH, as_=bearer(rs256(oidc_claims()))))
    for number in range(5):
        unknown = rs256(oidc_claims(), kid=f"unknown-{number}")
        assert_unauthorized(api.get(PATH, as_=bearer(unknown)))
    assert oidc.request_count == 1


@pytest.fixture
def later(monkeypatch):
    """``later(seconds)``: the monotonic clock (the key set cache's) moved on by ``seconds``."""
    real = time.monotonic
    return lambda seconds: monkeypatch.setattr(time, "monotonic", lambda: real() + seconds)


def test_a_key_the_issuer_removed_is_refused_once_the_key_set_is_fetched_again(api, oidc, later):
    """Rotated out (say, compromised): once the cached key set has expired and been fetched
    again without it, a token signed with it is refused.

    Fails today (200): ``cache_keys=True`` keeps every key once used in an LRU cache with no
    expiry, in front of the key set, so the removed key is used for as long as the process
    lives."""
    assert_accepted(api.get(PATH, as_=bearer(rs256(oidc_claims()))))
    oidc.document = {"keys": [public_jwk(OTHER_RSA_KEY.public_key(), RSAAlgorithm, "rsa-2")]}
    later(2 * 3600)
    assert_accepted(api.get(PATH, as_=bearer(rs256(oidc_claims(), kid="rsa-2", key=OTHER_RSA_KEY))))
    assert oidc.request_count == 2
    assert_unauthorized(api.get(PATH, as_=bearer(rs256(oidc_claims()))))


def test_a_failing_issuer_is_not_asked_for_its_key_set_by_every_request(api, oidc, later):
    """While the issuer fails, one request in ``KEY_SET_RETRY_SECONDS`` asks it again: every
    request asking would wait for it (up to the 5 s timeout, one at a time), and a flood of
    made-up ``kid``s would be a flood of requests to the issuer.

    Fails today (a fetch per request): PyJWT starts its cooldown on a successful fetch only,
    and a failed one leaves the key set uncached."""
    oidc.document = b"<html>down for maintenance</html>"
    for _ in range(3):
        assert_issuer_unavailable(api.get(PATH, as_=bearer(rs256(oidc_claims()))))
    assert oidc.request_count == 1
    oidc.document = {"keys": [public_jwk(RSA_KEY.public_key(), RSAAlgorithm, RSA_KID)]}
    later(KEY_SET_RETRY_SECONDS)
    assert_accepted(api.get(PATH, as_=bearer(rs256(oidc_claims()))))
    oidc.document = b"<html>down for maintenance</html>"
    later(KEY_SET_RETRY_SECONDS + 60)  # past PyJWT's cooldown for unknown kids
    for number in range(3):
        unknown = rs256(oidc_claims(), kid=f"unknown-{number}")
        assert_unauthorized(api.get(PATH, as_=bearer(unknown)))
    assert oidc.request_count == 3


def test_the_last_key_set_stays_in_use_while_the_issuer_fails(api, oidc, later):
    """The cached key set has expired and the issuer does not answer: its users are not all
    locked out (the key set is fetched again once the issuer answers)."""
    assert_accepted(api.get(PATH, as_=bearer(rs256(oidc_claims()))))
    oidc.document = b"<html>down for maintenance</html>"
    later(2 * 3600)
    assert_accepted(api.get(PATH, as_=bearer(rs256(oidc_claims()))))
    assert_accepted(api.get(PATH, as_=bearer(es256(oidc_claims()))))
    assert oidc.request_count == 2


def test_unreachable_key_set(api, oidc, jwt_settings):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    jwt_settings.MEMSVC_JWT_JWKS_URL = f"http://127.0.0.1:{port}/jwks.json"
    # Not counted as failed authentications: the address is not locked out by them.
    jwt_settings.MEMSVC_AUTH_FAILURE_LIMIT = 2
    jwt_settings.MEMSVC_JWT_SECRET = SECRET
    address = {"REMOTE_ADDR": f"192.0.2.{uuid.uuid4().int % 250 + 1}"}
    for _ in range(4):
        response = api.call("GET", PATH, as_=bearer(rs256(oidc_claims())), headers=address)
        assert_issuer_unavailable(response)
    mine = bearer(token(oidc_claims(), SECRET))
    assert_accepted(api.call("GET", PATH, as_=mine, headers=address))


@pytest.mark.parametrize(
    ("alg", "kid"),
    [
        ("RS256", EC_KID),  # an RSA algorithm naming the EC key
        ("ES256", RSA_KID),  # an EC algorithm naming the RSA key
        ("ES384", EC_KID),  # ES384 naming a P-256 key
    ],
)
def test_kid_of_a_key_of_another_type_is_refused(api, oidc, alg, kid):
    """Anyone can name any ``kid`` with any accepted ``alg``: no signature is needed to get
    this far, so it must be a 401, not a server error.

    Fails today (500): ``decode_user_token`` passes the bare key (``PyJWK.key``) to
    ``jwt.decode``, so PyJWT prepares an EC key for an RSA algorithm (``TypeError``) or a
    P-256 key for ES384 (``InvalidKeyError``, not an ``InvalidTokenError``); neither is caught.
    """
    mismatched = hand_made_token({"alg": alg, "typ": "JWT", "kid": kid}, oidc_claims())
    assert_unauthorized(api.get(PATH, as_=bearer(mismatched)))


@pytest.mark.parametrize(
    "document",
    [{"keys": []}, {"nothing": "here"}, b"<html>not json</html>", b"[]"],
    ids=["no-keys", "no-keys-member", "not-json", "not-an-object"],
)
def test_broken_key_set(api, oidc, jwt_settings, document):
    """An issuer answering nonsense: like an unreachable one, a 503 and not a server error
    (nor a 401, review).

    Fails today (500) for all but "not-an-object": ``PyJWKSetError`` (no usable keys) and
    ``json.JSONDecodeError`` (a body that is not JSON) escape ``decode_user_token``, which only
    catches ``InvalidTokenError`` and ``PyJWKClientError``.
    """
    with JwksServer(document) as broken:
        jwt_settings.MEMSVC_JWT_JWKS_URL = broken.url
        assert_issuer_unavailable(api.get(PATH, as_=bearer(rs256(oidc_claims()))))


def test_a_user_token_cannot_name_an_agent(api):
    """Agent principals come from API keys; a ``sub`` of ``agent:<id>`` would borrow access."""
    response = api.get(PATH, as_=bearer(token(claims(sub="agent:1234"), SECRET)))
    assert response.status_code == 400
    assert "agent" in response.json()["error"]


@pytest.mark.parametrize("sub", ["\uff42\uff4f\uff42", "zoe\u0308", "AGENT:x"])
def test_a_user_stored_before_the_rules_of_given_ids_still_authenticates(api, sub):
    """NFKC and ``agent:`` in any case are rules of ids given (shared with, offered): a
    token's ``sub`` held to them locked out who was stored before them (code review)."""
    response = api.get(PATH, as_=bearer(token(claims(sub=sub), SECRET)))
    assert response.status_code == 200, response.content


@pytest.mark.parametrize("sub", ["local", "memsvc"])
def test_a_token_for_the_owner_of_memsvcs_own_agents_is_refused(api, sub):
    """A user "local" had every operator agent as an agent of their own on the pages, its
    blocks in a prompt they read back (review): no user is the owner of memsvc's agents."""
    response = api.get(PATH, as_=bearer(token(claims(sub=sub), SECRET)))
    assert response.status_code == 400
    assert f"must not be {sub!r}: it owns memsvc's own agents" in response.json()["error"]
