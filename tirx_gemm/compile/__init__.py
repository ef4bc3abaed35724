"""build: see CONTRIBUTING.md, "The architecture in one picture"."""
