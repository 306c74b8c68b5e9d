"""Tools that measure the product, one layer above the run and below the command line.

:mod:`.bench` (``headscope bench``: what each capture path, stage and report costs),
:mod:`.sweep` (``headscope sweep``: every stage on a tiny model of each text family) and
:mod:`.experiments` (the README's figures, ``make figures``, and studies beyond the pipeline).
They import ``headscope.probes``, ``headscope.analyses`` and the rest of ``headscope.reports``;
none of those imports them (``tests/test_import_graph.py``).
"""
