"""Logging in to the pages: Django's views, with the lockout of failed logins."""

from django.contrib.auth import views as auth_views

from memsvc.pages.forms import LoginForm, refused_as_locked_out
from memsvc.pages.views.common import not_a_page


class LoginView(auth_views.LoginView):
    """Django's login, answering a locked-out address 429 (``refused_as_locked_out``)."""

    template_name = "pages/login.html"
    authentication_form = LoginForm
    redirect_authenticated_user = True

    def form_invalid(self, form):
        return refused_as_locked_out(super().form_invalid(form))


class LogoutView(auth_views.LogoutView):
    """Django's logout (a POST); its address opened in the browser, ``not_a_page``."""

    def http_method_not_allowed(self, request, *args, **kwargs):
        return not_a_page(request, ", ".join(self._allowed_methods()))
