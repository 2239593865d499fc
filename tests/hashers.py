"""Password hashers for the test suite: Django's PBKDF2 with few iterations (and one that
counts its checks).

The default (1,000,000 iterations) takes about half a second a hash on the CI machine, and
every page test logs people in. The hashes are ordinary ``pbkdf2_sha256`` ones, with their
iteration count in them: a process started by a test (``memsvc serve``) verifies them with
Django's own hasher.
"""

import time
from typing import ClassVar

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1_000


class CountedPasswordHasher(QuickPBKDF2PasswordHasher):
    """For the lockout's tests: records every password it checks, each taking as long as a
    real check (``SECONDS``), so that logins sent at once are all in their checks together."""

    algorithm = "counted_pbkdf2_sha256"
    SECONDS = 0.3
    checked: ClassVar[list[str]] = []

    def verify(self, password, encoded):
        self.checked.append(password)
        time.sleep(self.SECONDS)
        return super().verify(password, encoded)
