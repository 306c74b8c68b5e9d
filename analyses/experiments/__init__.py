"""Studies beyond the main pipeline: Ray-sharded streaming (:mod:`.distributed`) and train-small
vs prune-big on a synthetic task (:mod:`.train_time`)."""
