"""The login forms (the pages' and the admin's): Django's, saying so when the address is
locked out by failed logins."""

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from memsvc.api.ratelimit import login_lockout

LOCKED_OUT = "Too many failed logins from this address. Please try again in a minute."


class LockoutAware:
    """A login form that says when the address is locked out (``memsvc.api.ratelimit``): a
    person with the right password is then refused too, and should not be told that it did
    not match."""

    locked_out = False

    def clean(self):
        if self.request is not None and login_lockout(self.request):
            self.locked_out = True
            raise ValidationError(LOCKED_OUT, code="locked_out")
        return super().clean()


class LoginForm(LockoutAware, AuthenticationForm):
    """The pages' login (``pages/login.html`` shows ``LOCKED_OUT`` itself)."""


class AdminLoginForm(LockoutAware, AdminAuthenticationForm):
    """The admin's login (``admin.site.login_form``): its page shows the form's error."""
