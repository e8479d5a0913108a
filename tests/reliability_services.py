"""Services for the reliability tests: each execution appends a line to a
file, so a test counts how many times each call really ran."""
import time


def count(path: str, token: str, seconds: float = 0.0) -> str:
    with open(path, "a") as f:
        f.write(token + "\n")
        f.flush()
    if seconds:
        time.sleep(seconds)
    return token


def count_then_exit(path: str, token: str) -> str:
    """Counts its run, then its worker process exits abruptly (status 3)."""
    import os
    count(path, token)
    os._exit(3)
