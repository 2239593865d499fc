"""Typed access to the environment.

Every setting of memsvc comes from the environment through these helpers. A value that is
present but malformed is an error at start-up (``ImproperlyConfigured``), never a silent
fallback to the default.
"""

import dataclasses
import ipaddress
import math
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def env_str(name: str, default: str | None = None) -> str | None:
    value = _raw(name)
    return default if value is None else value


def env_required(name: str) -> str:
    value = _raw(name)
    if value is None:
        raise ImproperlyConfigured(f"{name} must be set")
    return value


# Numbers as ASCII writes them: Python's int() and float() read "4_0" and Arabic-Indic
# digits too (review).
_INTEGER = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def env_int(
    name: str, default: int, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    value = _raw(name)
    if value is None:
        return default
    if not _INTEGER.fullmatch(value):
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}")
    number = int(value)
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise ImproperlyConfigured(f"{name} must be <= {maximum}, got {number}")
    return number


def env_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be one of {sorted(_TRUE | _FALSE)}, got {value!r}")


def env_choice(name: str, default: str, choices: tuple[str, ...], *, upper: bool = False) -> str:
    """One of ``choices``; ``upper``: given in any case (``debug`` for ``DEBUG``)."""
    value = _raw(name) or default
    if upper:
        value = value.upper()
    if value not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def env_path(name: str, default: Path) -> Path:
    value = _raw(name)
    return (Path(value) if value is not None else default).expanduser()


def usable_directory(path: Path, setting: str, *, mode: int = 0o777) -> Path:
    """``path`` made, with its parents, when missing (itself with ``mode``, less the umask);
    ``ImproperlyConfigured`` naming the ``setting`` that chose it when it cannot be a
    directory (a file of that name, a place memsvc may not write in), rather than a
    traceback."""
    try:
        path.mkdir(mode=mode, parents=True, exist_ok=True)
    except OSError as exc:
        raise unusable_directory(path, setting, exc) from None
    return path


def data_directory(path: Path) -> Path:
    """``MEMSVC_DATA_DIR`` made when missing as its user's alone (0700: it holds the local
    secrets, the database and the local queue's tasks; it was 0755: review). One that is
    there already is left as it is."""
    return usable_directory(path, "MEMSVC_DATA_DIR", mode=0o700)


def unusable_directory(path: Path, setting: str, exc: OSError) -> ImproperlyConfigured:
    """What to raise when memsvc cannot write where ``setting`` chose (read-only, full)."""
    return ImproperlyConfigured(
        f"{setting} ({path}) is no directory memsvc can use: {exc.strerror}"
    )


def lock_alone(path: Path) -> int | None:
    """A descriptor holding the lock of the file ``path`` (made if missing) for this process
    alone until it is closed, or None when another holds it (nothing waits)."""
    import fcntl

    descriptor = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    return descriptor


def env_url(
    name: str, default: str | None, *, schemes: tuple[str, ...], several: bool = False
) -> str | None:
    """A URL whose scheme is one of ``schemes`` (``redis``, ``rediss``...), or ``default``.
    ``several``: URLs separated by ``;`` (kombu's failover brokers), each checked. A scheme
    ``a+b`` (kombu's ``sqla+postgresql``) counts as ``a``."""
    value = env_str(name, default)
    if value is None:
        return None
    for url in value.split(";") if several else [value]:
        shown = password_hidden(url.strip())
        try:
            parts = urlsplit(url.strip())
        except ValueError as error:  # ("Invalid IPv6 URL": a traceback; review)
            raise ImproperlyConfigured(f"{name} must be a URL, got {shown!r}: {error}") from None
        if parts.scheme.partition("+")[0] not in schemes:
            expected = ", ".join(f"{scheme}://" for scheme in schemes)
            raise ImproperlyConfigured(f"{name} must start with one of {expected}, got {shown!r}")
        try:
            parts.port  # noqa: B018 - raises ValueError on a port that is not a number in range
        except ValueError as error:
            raise ImproperlyConfigured(f"{name} must be a URL, got {shown!r}: {error}") from None
    return value


def password_hidden(url: str) -> str:
    """``url`` as a message may show it: its password, if any, as ``**`` (as Celery shows a
    broker's). A refused setting was said whole, the password of a database or a broker
    with it (review). Read from the text itself, not as a URL: the URLs refused are those
    a parser does not read as meant (``user:pw@host`` without its scheme, ``postgres//``)."""
    head, at, host = url.rpartition("@")
    if not at:
        return url
    start = head.find("//")
    start = start + 2 if start >= 0 else 0  # where the user's name begins
    user, colon, _ = head[start:].partition(":")
    return f"{head[:start]}{user}:**@{host}" if colon else url


def env_list(name: str, default: list[str]) -> list[str]:
    value = _raw(name)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def env_hosts(name: str, default: list[str]) -> list[str]:
    """Host names as Django's ``ALLOWED_HOSTS`` takes them (``example.com``,
    ``.example.com``, ``[::1]``, ``*``), at least one: a URL there (``https://...``), a port
    (which Django never matches) or nothing but commas made every request a 400, health
    checks too, with nothing said."""
    hosts = env_list(name, default)
    if not hosts:
        raise ImproperlyConfigured(f"{name} names no host")
    for host in hosts:
        bracketed = host.startswith("[") and host.endswith("]")  # an IPv6 address
        if "/" in host or "@" in host or (":" in host and not bracketed):
            problem = "without a scheme, path or port"
        elif "*" in host and host != "*":
            problem = "a domain and its subdomains as .example.com, not *.example.com"
        elif host.endswith("."):
            problem = "without the trailing dot"
        elif not host.isascii():
            problem = "an international name as its ASCII form (xn--...)"
        else:
            continue
        raise ImproperlyConfigured(
            f"{name} must name hosts (example.com, .example.com, [::1]), {problem}: got {host!r}"
        )
    return hosts


def _origin_problem(origin: str) -> str | None:
    """Why ``origin`` is not a web origin as a browser sends it (``scheme://host[:port]``,
    nothing after), or None when it is."""
    if origin == "*":
        return "a wildcard is not allowed: name each origin"
    try:
        parts = urlsplit(origin)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in range
    except ValueError as error:
        return str(error)
    if parts.scheme not in ("http", "https"):
        return "must start with http:// or https://"
    if not parts.hostname or parts.username is not None or parts.password is not None:
        return "must name a host, without user or password"
    if f"{parts.scheme}://{parts.netloc}".lower() != origin.lower():
        return "must be scheme://host[:port] with nothing after (no path, no trailing slash)"
    if origin != origin.lower():
        return "must be in lower case, as browsers send it"
    return None


def env_origins(name: str) -> list[str]:
    """A comma-separated list of web origins (``https://chat.example.com,http://localhost:5173``),
    each exactly as a browser sends it in ``Origin``; none by default."""
    origins = env_list(name, [])
    for origin in origins:
        problem = _origin_problem(origin)
        if problem:
            raise ImproperlyConfigured(f"{name}: {origin!r} is not an origin: {problem}")
    return origins


def env_networks(name: str) -> list[str]:
    """A comma-separated list of IP addresses or networks (``127.0.0.1,10.0.0.0/8,::1``), each
    written as ``ipaddress`` writes it; none by default."""
    networks = []
    for item in env_list(name, []):
        try:
            networks.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise ImproperlyConfigured(
                f"{name}: {item!r} is neither an IP address nor a network (10.0.0.0/8)"
            ) from None
    return networks


def env_changes(name: str, tunables: type) -> dict:
    """Changes to the defaults of the dataclass ``tunables`` (``search.tuning.SearchTuning``):
    comma-separated ``field=value`` (``feedback_words=20,citation_mode=semantic``), each value
    read as its field's type (int, float, str); none by default. Checked by making
    ``tunables`` with them: its own checks (a ValueError) are errors here too."""
    types = {item.name: item.type for item in dataclasses.fields(tunables)}
    changes = {}
    for item in env_list(name, []):
        field, equals, text = (part.strip() for part in item.partition("="))
        if not equals or field not in types:
            raise ImproperlyConfigured(
                f"{name}: {item!r} is not field=value of one of {', '.join(types)}"
            )
        if field in changes:
            raise ImproperlyConfigured(f"{name}: {field} is given twice")
        kind = types[field]
        try:
            if kind in (int, float) and not (_INTEGER if kind is int else _NUMBER).fullmatch(text):
                raise ValueError(text)
            value = kind(text)
        except ValueError:
            raise ImproperlyConfigured(
                f"{name}: {field} must be {'an integer' if kind is int else 'a number'}, "
                f"got {text!r}"
            ) from None
        if kind is float and not math.isfinite(value):
            raise ImproperlyConfigured(f"{name}: {field} must be a finite number, got {text!r}")
        changes[field] = value
    try:
        tunables(**changes)
    except ValueError as error:
        raise ImproperlyConfigured(f"{name}: {error}") from None
    return changes


# What a process of memsvc does, as its database connections name it (``application_name``:
# ``memsvc web``), by the program that runs it.
_ROLES = {
    "gunicorn": "web",
    "uvicorn": "web",
    "celery": "celery",
    "memsvc": "command",
    "cli": "command",  # (python -m memsvc.cli)
    "manage": "command",  # (manage.py migrate)
}


def process_role(argv: list[str]) -> str:
    """What the process of ``argv`` (``sys.argv``) does: ``web``, ``worker``, ``beat``, a
    ``memsvc`` command's name, else its program's name. Every connection had no name in
    ``pg_stat_activity``, so the web processes', the worker's and a command's could not be
    told apart when looking for what held them (review)."""
    if not argv:
        return "python"
    path = Path(argv[0])
    program = path.parent.name if path.name == "__main__.py" else path.stem
    role = _ROLES.get(program, program or "python")
    if role == "celery":
        return next((a for a in argv[1:] if a in ("worker", "beat")), role)
    if role == "command":
        return next((a for a in argv[1:] if not a.startswith("-")), "memsvc")
    return role
