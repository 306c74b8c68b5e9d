"""Sphinx configuration of headscope's documentation (``make docs``: strict, offline)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

from offline_inventories import inventories  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

project = "headscope"
author = "the headscope authors"
copyright = "the headscope authors"  # noqa: A001 - Sphinx's name
release = "0.1.0"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx_copybutton",
    "xref_check",
]

root_doc = "index"
exclude_patterns = ["_build", "jupyter_execute", ".jupyter_cache", "**/.ipynb_checkpoints"]
source_suffix = {".md": "myst-nb", ".rst": "restructuredtext"}

html_theme = "furo"
html_title = "headscope"
html_static_path = ["_static"]

# strict: make docs passes -W --keep-going -n; every Python reference must resolve (xref_check)
nitpicky = True
nitpick_ignore_regex = [
    # jaxtyping's shape aliases and type variables are written in signatures; they have no page
    (r"py:(class|obj|data)", r"(jaxtyping\.|headscope\.probes\.shapes\.|.*\bT\b$).*"),
]

# intersphinx from inventories written here from the installed packages: no network at build time
intersphinx_mapping = {name: (site, inv) for name, (site, inv) in inventories(HERE / "_build" / "inventories").items()}
intersphinx_timeout = 1

autodoc_default_options = {"members": False, "show-inheritance": False}
autodoc_typehints = "signature"
autodoc_member_order = "bysource"
autodoc_preserve_defaults = True
autoclass_content = "class"
napoleon_google_docstring = True
napoleon_numpy_docstring = True

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# the tutorials run at every build, on the shipped models. A failing cell is a warning that names
# the tutorial, prints the cell and its traceback (show_tb), and fails the build under -W;
# raise_on_error would stop at once naming only the file (the cell goes to a log file)
nb_execution_mode = "force"
nb_execution_raise_on_error = False
nb_execution_show_tb = True
nb_execution_timeout = 600
nb_merge_streams = True


class _EmptyTrailingGlob(logging.Filter):
    """The guide's toctree ends with ``*`` for pages other issues add (Sphinx globs only the pages
    the list left out): that glob matching nothing is expected, not a warning. Any other empty
    glob still warns (and fails the strict build)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not ("didn't match any documents" in str(record.msg) and record.args == ("*",))


def setup(app):
    logging.getLogger("sphinx.sphinx.directives.other").addFilter(_EmptyTrailingGlob())
