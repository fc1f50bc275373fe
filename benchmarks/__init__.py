"""Performance runs. Every figure is printed as JSON, as a ratio to a baseline
measured in the same run on the same machine."""
