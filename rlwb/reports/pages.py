"""The HTML rlwb writes from templates (`templates/*.html`): the index page, a sweep's report and each report's
provenance block.

Jinja2 with autoescape: every value a template prints is escaped unless it says otherwise, so a run's answer,
error or parameters cannot break the page. Values are escaped as `html.escape` does (`&quot;`, `&#x27;`; markupsafe
alone writes `&#34;`, `&#39;`), so an index page rebuilt from the same archive has the same bytes as the one
committed with it (docs/runs/index.html).
"""

from __future__ import annotations

import functools
import html
from pathlib import Path

TEMPLATES = Path(__file__).with_name("templates")


def _escaped(value):
    from markupsafe import Markup

    return value if isinstance(value, Markup) else Markup(html.escape(str(value)))


@functools.cache
def _environment():
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, finalize=_escaped,
                              keep_trailing_newline=True, undefined=jinja2.StrictUndefined)


def render(name: str, **context) -> str:
    """Template `name` (e.g. `index.html`) with `context`."""
    return _environment().get_template(name).render(**context)
