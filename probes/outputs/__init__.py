"""Writing output folders: atomic files (:mod:`.atomic`) and folders claimed, locked and swapped in
whole (:mod:`.folder`)."""
