"""Keeps credentials out of what a run logs: string values under secret-looking keys, and any
occurrence of a secret-looking environment variable's value, become `***`."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

SECRET_NAME = re.compile(r"key|token|secret|passw(or)?d|credential", re.IGNORECASE)
MASK = "***"
# Shorter values (flags like "1", "true") would mask harmless text everywhere.
MIN_SECRET_LEN = 8


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of environment variables named like credentials, longest first."""
    env = os.environ if environ is None else environ
    found = {v for k, v in env.items() if SECRET_NAME.search(k) and len(v) >= MIN_SECRET_LEN}
    return sorted(found, key=len, reverse=True)


def scrub(obj, secrets: list[str], key: str = ""):
    """A copy of `obj` (dicts, lists, scalars) with secrets masked. Only strings are masked: a number
    under a key like `tokens_per_s` is no credential."""
    if isinstance(obj, Mapping):
        return {k: scrub(v, secrets, str(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub(v, secrets, key) for v in obj]
    if isinstance(obj, str):
        if SECRET_NAME.search(key) and obj:
            return MASK
        for secret in secrets:
            obj = obj.replace(secret, MASK)
    return obj
