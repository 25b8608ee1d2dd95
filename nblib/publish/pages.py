"""HTML through jinja2 templates (nblib/publish/templates/): the run's index page and the published
site's pages. Every link a template writes is relative, so a folder can be served or attached as is."""

from pathlib import Path

import jinja2

TEMPLATES = Path(__file__).parent / "templates"

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=True,
    undefined=jinja2.StrictUndefined,  # a misspelt name fails the build instead of rendering blank
    trim_blocks=True,
    lstrip_blocks=True,
)


def render(name, **context):
    return _env.get_template(name).render(**{"nav": (), "footer": "", **context})
