"""HTML through jinja2 templates (nblib/publish/templates/): the run's index page and the published
site's pages. Every link a template writes is relative, so a folder can be served or attached as is."""

from pathlib import Path
from typing import Any

import jinja2
import nbformat
from nbconvert import HTMLExporter

__all__ = ["TEMPLATES", "notebook_html", "render"]

TEMPLATES = Path(__file__).parent / "templates"

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=True,
    undefined=jinja2.StrictUndefined,  # a misspelt name fails the build instead of rendering blank
    trim_blocks=True,
    lstrip_blocks=True,
)


def render(name: str, **context: Any) -> str:
    return _env.get_template(name).render(**{"nav": (), "footer": "", **context})


def notebook_html(
    ipynb: str | Path, template: str = "offline", resources: dict[str, Any] | None = None, **options: Any
) -> str:
    """An executed notebook as one HTML page through a template here that loads nothing from the
    network ("offline": the run folder's pages; "nbpage": the site's, with its nav and folded code).
    options: HTMLExporter's (exclude_input, ...); prompts are always left out."""
    exporter = HTMLExporter(
        extra_template_basedirs=[str(TEMPLATES)],
        extra_template_paths=[str(TEMPLATES)],  # so one template here can extend another
        template_name=template,
        exclude_input_prompt=True,
        exclude_output_prompt=True,
        **options,
    )
    body, _ = exporter.from_notebook_node(nbformat.read(ipynb, 4), resources=resources)
    return body
