from django.contrib import admin
from django.urls import path, re_path

from memsvc.api.errors import not_found_view
from memsvc.api.health import HealthView

v1 = [
    path("v1/health", HealthView.as_view(), name="health"),
    # Unknown routes under /v1 answer in the API's error shape, not Django's HTML page.
    re_path(r"^v1(?:/.*)?$", not_found_view),
]

urlpatterns = [
    path("admin/", admin.site.urls),
    *v1,
]
