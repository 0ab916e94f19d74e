"""Side-by-side benchmarks of stoic against peer libraries (run: `make bench`)."""
