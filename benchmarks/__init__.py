"""gridrpc benchmarks: ``python -m benchmarks`` (or ``gridrpc bench``) runs the
suite against the raw pyzmq floor and, when installed, Ray and Dask. See
docs/performance.md."""
