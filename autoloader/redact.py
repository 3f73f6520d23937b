"""User-info in URLs (``http://alice:s3cret@host/...``), kept out of what is written or
printed.

A URL's user and password are for the connection alone: the process that reads the data
keeps them in memory. A plan is a file people share, and error lines and logs are pasted
into tickets, so whatever autoloader writes or prints names the URL as pip and curl do:
``http://alice:****@host/...``, and a user-info without a password (a token) as
``http://****@host/...``. Every error autoloader raises is redacted as it is made
(``autoloader.errors``), and so is every line the command line prints.
"""

from __future__ import annotations

import logging
import re

# SCHEME://USER[:PASSWORD]@ within one URL's authority: no "/" or space before the "@",
# the password up to the authority's last "@" (a raw "@" in a password is common)
_USERINFO = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)"
    r"(?P<user>[^\s/@:'\"<>]*)(?P<password>:[^\s/'\"<>]*)?@"
)
MASK = "****"


def _masked(found: re.Match[str]) -> str:
    if found.group("password") is None:
        return f"{found.group('scheme')}{MASK}@"
    return f"{found.group('scheme')}{found.group('user')}:{MASK}@"


def redact(text: str) -> str:
    """``text`` with the user-info of every URL in it masked (``user:****@``)."""
    if "@" not in text:
        return text
    return _USERINFO.sub(_masked, text)


class Redacting(logging.Filter):
    """A log filter that masks the user-info of URLs in each record's message."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record logging itself cannot format: left to the handler
            return True
        shown = redact(message)
        if shown != message:
            record.msg, record.args = shown, None
        return True
