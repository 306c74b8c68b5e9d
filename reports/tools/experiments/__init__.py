"""The README's figures regenerated from code (``make figures``: :mod:`.patching_figures`,
:mod:`.atp_figures`, :mod:`.report_figures`, :mod:`.weights_figures`, :mod:`.kv_figures`, written by
:mod:`.figures_doc`), and studies beyond the main pipeline: Ray-sharded streaming
(:mod:`.distributed`) and train-small vs prune-big on a synthetic task (:mod:`.train_time`)."""
