"""The one HTML page shell every report memwarden writes is built on.

A report is a single self-contained file a user opens offline or attaches to an issue: the
stylesheet inline, no external resource, and a Content-Security-Policy that allows nothing else
(no script unless a page names its own by hash). Every page generator (the trace report, the
comparison of two traces, the partition plan, the stress campaign) gives its title, stylesheet and
body here, so the head of every page, its escaping and its policy are written once.

The house stylesheet (``html_page.css``, beside this module) belongs here too, not to ``report/``:
the stress campaign's page (``resilience/``) sits below ``report/`` in the layers and shares it.
"""

from __future__ import annotations

import html
from importlib import resources

__all__ = ["STRICT_CSP", "escape", "html_page", "report_page"]

# nothing but inline styles and data: images; a page with a script adds its hash (report/html.py)
STRICT_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def escape(value: object) -> str:
    """``value`` as text safe inside an element or a quoted attribute (``&``, ``<``, ``>``, both quotes)."""
    return html.escape(str(value), quote=True)


def html_page(title: str, body: str, *, style: str, csp: str = STRICT_CSP) -> str:
    """A complete page: ``title`` (escaped here), ``style`` inline, ``body`` as given (its text
    already escaped by the caller), under ``csp`` (memwarden's own constant, written as is)."""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="memwarden">
<title>{escape(title)}</title>
<style>{style}</style>
</head>
<body>
{body}
</body>
</html>
"""


def report_page(title: str, body: str, *, csp: str = STRICT_CSP) -> str:
    """:func:`html_page` in the house style of memwarden's reports (the trace report, a stress
    campaign): the stylesheet shipped beside this module, inline."""
    style = resources.files("memwarden").joinpath("html_page.css").read_text(encoding="utf-8")
    return html_page(title, body, style=style, csp=csp)
