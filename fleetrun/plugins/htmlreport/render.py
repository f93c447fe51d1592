"""The HTML report as a file: the template drawn with Jinja2 (autoescaping on), the
page's one inline script allowed by its hash in a Content-Security-Policy that allows
nothing else, and the file written atomically.

Jinja2 is imported here only, and only when a report is written: ``--help`` and
``status`` never import it.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model import Report

HERE = Path(__file__).parent
TEMPLATE = "report.html.j2"
SCRIPT = HERE / "report.js"


def csp(script: str) -> str:
    """The page's policy: nothing from anywhere (no network, no other script, no font),
    its own inline style, and its one script by hash."""
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    return (
        f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{digest}'; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )


def render(report: Report) -> str:
    """The page of ``report``: every string of it escaped by the template engine."""
    import jinja2
    from markupsafe import Markup

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(HERE)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    script = SCRIPT.read_text(encoding="utf-8")
    # the script is this package's own file, not the ledger's text: it goes in as it is,
    # and its exact text is what the policy's hash allows
    return env.get_template(TEMPLATE).render(r=report, csp=csp(script), script=Markup(script))


def write(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file + rename), making its folder: a
    browser reloading it mid-run reads the old page or the new one, never half."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
