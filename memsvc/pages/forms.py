"""The pages' forms that are not a service's input."""

from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from memsvc.api.ratelimit import login_lockout


class LoginForm(AuthenticationForm):
    """Django's login form, saying so when the address is locked out by failed logins
    (``memsvc.api.ratelimit``): a person with the right password is then refused too, and
    should not be told that it did not match."""

    locked_out = False

    def clean(self):
        if self.request is not None and login_lockout(self.request):
            self.locked_out = True
            raise ValidationError("too many failed logins from this address", code="locked_out")
        return super().clean()
