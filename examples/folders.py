"""Checks of the folders a run writes in, for the trainers and results.py.

Kept apart from ``cli.py`` so that ``results.py`` checks its ``--out``
without importing Chainer.
"""

import os
import tempfile


def folder_problem(path, create):
    """Why ``path`` is not a folder to write in (``create``: or make), or None.

    With ``create`` the missing folders are made to try, and removed
    again.
    """
    if not path:
        # abspath('') is the current folder, but open('') and listdir('')
        # fail: the checks would pass and the run fail halfway.
        return 'an empty path names no folder (. is the current one)'
    if not create:
        if not os.path.exists(path):
            return 'no such folder'
        return None if os.path.isdir(path) else 'not a folder'
    missing = []
    head = os.path.abspath(path)
    while not os.path.exists(head):
        missing.append(head)
        head = os.path.dirname(head)
    if not os.path.isdir(head):
        return 'not a folder' if not missing else (
            '{} is not a folder'.format(head))
    made = []
    try:
        for folder in reversed(missing):
            os.mkdir(folder)
            made.append(folder)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        return 'cannot {} ({})'.format(
            'write there' if not missing else 'make the folder',
            e.strerror or e)
    finally:
        for folder in reversed(made):
            os.rmdir(folder)
    return None


def shown(path):
    """``path`` as a message names it: an empty one quoted, as typed."""
    return path or "''"
