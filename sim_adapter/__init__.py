"""flockring package."""
