"""A password hasher for the test suite: Django's PBKDF2 with few iterations.

The default (1,000,000 iterations) takes about half a second a hash on the CI machine, and
every page test logs people in. The hashes are ordinary ``pbkdf2_sha256`` ones, with their
iteration count in them: a process started by a test (``memsvc serve``) verifies them with
Django's own hasher.
"""

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1_000
