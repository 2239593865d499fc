"""Reading the pages' HTML in tests: form controls without a label, and scripts inline."""

from html.parser import HTMLParser

_CONTROLS = {"input", "textarea", "select"}
_UNLABELLED_TYPES = {"hidden", "submit", "button"}


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.controls: list[dict] = []
        self.label_for: set[str] = set()
        self.scripts: list[dict] = []
        self.inline_handlers: list[str] = []
        self.style_attributes = 0

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag in _CONTROLS and attributes.get("type") not in _UNLABELLED_TYPES:
            self.controls.append(attributes)
        if tag == "label" and attributes.get("for"):
            self.label_for.add(attributes["for"])
        if tag == "script":
            self.scripts.append(attributes)
        self.inline_handlers += [name for name in attributes if name.startswith("on")]
        self.style_attributes += "style" in attributes


def read(html: str | bytes) -> _Page:
    page = _Page()
    page.feed(html.decode() if isinstance(html, bytes) else html)
    return page


def unlabelled_controls(html) -> list[dict]:
    """Inputs, text areas and selects that no ``<label for>`` names and have no aria-label."""
    page = read(html)
    return [
        control
        for control in page.controls
        if control.get("id") not in page.label_for and not control.get("aria-label")
    ]


def inline_scripts(html) -> list:
    """``<script>`` without ``src``, and ``on*=`` handler attributes: what the CSP forbids."""
    page = read(html)
    return [s for s in page.scripts if not s.get("src")] + page.inline_handlers


class _Forms(HTMLParser):
    def __init__(self):
        super().__init__()
        self.forms: list[dict] = []
        self._select: str | None = None

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "form":
            self.forms.append({"action": attributes.get("action", ""), "fields": {}})
        elif not self.forms:
            return
        fields = self.forms[-1]["fields"]
        if tag == "input" and attributes.get("name"):
            fields[attributes["name"]] = attributes.get("value", "")
        elif tag == "textarea" and attributes.get("name"):
            fields[attributes["name"]] = ""  # (its text is not read here)
        elif tag == "select":
            self._select = attributes.get("name")
        elif tag == "option" and self._select and "selected" in attributes:
            fields[self._select] = attributes.get("value", "")

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None


def forms(html) -> list[dict]:
    """The page's forms: each ``{"action": ..., "fields": {name: value}}`` as a browser would
    send it (hidden and text inputs, the selected option; entities decoded)."""
    parser = _Forms()
    parser.feed(html.decode() if isinstance(html, bytes) else html)
    return parser.forms
