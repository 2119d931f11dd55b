"""TEI's own HTTP routes."""
