"""The login forms (the pages' and the admin's): Django's, saying so when the address is
locked out by failed logins, and answered as the APIs answer it (``refused_as_locked_out``)."""

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from memsvc.api.errors import RateLimited
from memsvc.api.ratelimit import LOGINS_BUSY, login_refusal


def locked_out(refusal: RateLimited) -> str:
    """Why a locked-out address is refused, with the wait its ``Retry-After`` says (the page
    said "a minute" when the header said 2 seconds; review)."""
    seconds = int(refusal.headers["Retry-After"])
    return (
        "Too many failed logins from this address. Please try again in "
        f"{seconds} second{'s' if seconds != 1 else ''}."
    )


class LockoutAware:
    """A login form that says when the address is locked out (``memsvc.api.ratelimit``): a
    person with the right password is then refused too, and should not be told that it did
    not match."""

    refusal: RateLimited | None = None

    @property
    def locked_out(self) -> bool:
        return self.refusal is not None

    def clean(self):
        try:
            return super().clean()
        except ValidationError:
            # Refused by the backend (``LockoutModelBackend``) before the password was
            # checked: the address is locked out, whatever the password. Decided there, as
            # the password is checked, not by a count read before: in a burst of logins at
            # once, the count read here was under the limit for some whose check was then
            # refused, and they were told the password did not match (review).
            self.refusal = login_refusal(self.request) if self.request is not None else None
            if self.refusal is None:
                raise
            busy = self.refusal.message == LOGINS_BUSY  # (no password of anyone's checked)
            why = LOGINS_BUSY if busy else locked_out(self.refusal)
            raise ValidationError(why, code="locked_out") from None


class LoginForm(LockoutAware, AuthenticationForm):
    """The pages' login (``pages/login.html`` shows ``locked_out``'s words itself)."""


class AdminLoginForm(LockoutAware, AdminAuthenticationForm):
    """The admin's login (``memsvc.admin_site.AdminSite``): its page shows the form's error."""


def refused_as_locked_out(response):
    """A login page's answer (a ``TemplateResponse`` with its ``form``), made 429 with
    ``Retry-After`` when the form refused a locked-out address, as the APIs answer one: a
    script guessing passwords is told to stop, not shown a page like any wrong guess's."""
    form = (getattr(response, "context_data", None) or {}).get("form")
    refusal = getattr(form, "refusal", None)
    if refusal is not None:
        response.status_code = refusal.status_code
        for name, value in refusal.headers.items():
            response[name] = value
    return response
