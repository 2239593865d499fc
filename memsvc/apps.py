from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class MemsvcConfig(AppConfig):
    default = True  # (the app's; ``AdminConfig`` below is django.contrib.admin's)
    name = "memsvc"
    verbose_name = "memsvc"

    def ready(self):
        from django.contrib.auth import get_user_model
        from django.contrib.auth.validators import UnicodeUsernameValidator

        from memsvc import checks  # noqa: F401 (registers them)
        from memsvc.api.principals import user_id_validator

        # A login's username is its principal id (the pages act as ``Principal.user``):
        # one no user id can be is refused wherever a login is made (``createsuperuser``
        # made "..", which the admin's form refused; review), and one a user id can be is
        # taken (Django's own rule refused "auth0|abc123", an issuer's usual ``sub``, which
        # ``memsvc user create`` made: review).
        validators = get_user_model()._meta.get_field("username").validators
        validators[:] = [
            *(v for v in validators if not isinstance(v, UnicodeUsernameValidator)),
            user_id_validator,
        ]


class AdminConfig(admin_apps.AdminConfig):
    """``django.contrib.admin`` (INSTALLED_APPS) with memsvc's site as ``admin.site``."""

    default = False
    default_site = "memsvc.admin_site.AdminSite"
