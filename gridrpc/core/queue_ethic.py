"""Placeholder: the fair optional-computation policy lands here (issue 4)."""
