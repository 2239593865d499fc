from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class MemsvcConfig(AppConfig):
    default = True  # (the app's; ``AdminConfig`` below is django.contrib.admin's)
    name = "memsvc"
    verbose_name = "memsvc"

    def ready(self):
        from memsvc import checks  # noqa: F401 (registers them)


class AdminConfig(admin_apps.AdminConfig):
    """``django.contrib.admin`` (INSTALLED_APPS) with memsvc's site as ``admin.site``."""

    default = False
    default_site = "memsvc.admin_site.AdminSite"
