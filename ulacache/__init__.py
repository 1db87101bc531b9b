"""ulacache package."""
