"""The pages' Content-Security-Policy: scripts, styles and everything else from this origin
only, no inline script or style, no framing (beside X-Frame-Options), forms posted here only.
And no page kept by the browser or a proxy: each shows someone's conversations or memory,
which the back button of a shared computer showed after the logout (review).

htmx is a static file of this origin (django-htmx ships it) told by its ``htmx-config`` meta
tag not to evaluate code or inject its indicator styles, so it runs under this policy.
"""

from django.urls import reverse
from django.utils.cache import add_never_cache_headers

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
        "object-src 'none'",
    ]
)


class ContentSecurityPolicyMiddleware:
    """Sets the policy, and that nothing keeps the page, on the pages' responses (the API
    answers JSON; the admin and the API docs keep Django's and drf-spectacular's own pages
    as they are: the admin's are never cached either)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        # (Or an address under the pages' that no route takes: their 404 page, with the
        # person's name and the logout form, had neither: review.)
        if (match.namespace == "pages") if match else under_the_pages(request):
            response.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
            add_never_cache_headers(response)
        return response


def under_the_pages(request) -> bool:
    """Whether the request's address is under the pages' (a route of theirs or not)."""
    return request.path.startswith(reverse("pages:home"))
