"""One-off diagnostics: each answers one question about this machine or a mechanism (index: README.md here).

They are not part of the product's benchmarks (bench/): nothing imports them but their tests. Each writes
its run under bench/results/<name>/ like a benchmark; the finding lives in the write-up that cites it.
"""
