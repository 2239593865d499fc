from django.conf import settings
from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path, re_path, register_converter
from django.views.generic import RedirectView

from agents_api.local_api.views import UnknownRouteView
from agents_api.mcp_server.http import McpView
from memsvc.api.converters import AnyCaseUuidConverter
from memsvc.api.errors import not_found_view
from memsvc.api.health import HealthView
from memsvc.api.schema import DocsView, SchemaView

# Before the apps' URL confs, which name it.
register_converter(AnyCaseUuidConverter, "id")

v1 = [
    path("v1/health", HealthView.as_view(), name="health"),
    # The schema and its docs are public documents: no credentials, no rate limit.
    path("v1/schema", SchemaView.as_view(), name="schema"),
    path("v1/docs", DocsView.as_view(url_name="schema"), name="docs"),
    path("v1/user/", include("conversations.api.urls")),
    path("v1/user/", include("agents_api.api.user_urls")),
    path("v1/agent/", include("agents_api.api.urls")),
    # Letta's routes, for its agentic-learning SDK (agents_api/letta_api).
    path("v1/", include("agents_api.letta_api.urls")),
    # Unknown routes under /v1 answer in the API's error shape, not Django's HTML page.
    re_path(r"^v1(?:/[\s\S]*)?$", not_found_view),
]

# A path no route takes under the pages' is answered as they answer a refusal.
handler404 = "memsvc.pages.views.common.not_found"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("app/", include("memsvc.pages.urls")),
    *v1,
    # MCP over streamable HTTP (agents_api/mcp_server): an agent key's memory as tools.
    path("mcp", McpView.as_view(), name="mcp"),
    # Anything under it ("/mcp/", a client's URL with a slash) in the MCP endpoint's shape
    # (its refusals are the API's), not the local API's "Not Found" (review).
    re_path(r"^mcp/[\s\S]*$", not_found_view, {"instead": "/mcp"}),
    # The local compatibility API (seeds/local-memory-server.md) keeps the seed's paths.
    # A person who opens the service's address gets the web pages.
    path("", RedirectView.as_view(pattern_name="pages:home")),
    # What browsers ask for on every page they open (the admin's, the docs'): the pages' icon.
    path("favicon.ico", RedirectView.as_view(url=static("pages/icon.svg"), permanent=True)),
    path("", include("agents_api.local_api.urls")),
    # Last: any other path is the local API's (FastAPI's "Not Found"), but for the pages', the
    # admin's and static files' own (and their redirects to the path with a slash).
    re_path(
        rf"^(?!(?:app|admin|{settings.STATIC_URL.strip('/')})(?:/|$))",
        UnknownRouteView.as_view(),
    ),
]
