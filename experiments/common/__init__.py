"""Parts every command shares: one-line errors (``cli``), progress lines (``progress``), provenance (``provenance``)."""
