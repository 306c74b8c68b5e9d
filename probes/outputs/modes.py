"""The permissions headscope creates files and folders with: ``0666 & ~umask`` and
``0777 & ~umask``, as any other program would (not the ``0600`` of a bare temporary file).

>>> file_mode() & ~folder_mode()  # a file never gets a bit its folder lacks
0
"""

from __future__ import annotations

import os


def umask() -> int:
    """The process umask, read without changing it where /proc allows."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    return 0o666 & ~umask()


def folder_mode() -> int:
    return 0o777 & ~umask()
