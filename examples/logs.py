"""The names of what the trainers evaluate, and the logs of older versions.

The trainers report the test set as ``test/main/accuracy`` and
``test/main/loss``, and the validation set held out of the training
images (``--validation``) as ``val/main/accuracy`` and ``val/main/loss``.
Before, the test set's keys were Chainer's, ``validation/main/...`` (the
name of Chainer's Evaluator), which read as the validation set's: the
readers of logs (``results.py``, ``study.py``, the tests) take every log
through ``upgraded``, so that the logs and snapshots of older runs read as
new ones. No Chainer here: ``results.py`` reads logs without it.
"""

import json

#: The prefixes of the evaluators' keys: the test set, the held-out split.
TEST = 'test'
VALIDATION = 'val'
#: The test set's prefix in older logs, Chainer's Evaluator's default.
OLD_TEST = 'validation'


def upgraded_key(key):
    """``key`` of a log of any version, as the trainers name it now."""
    if key.startswith(OLD_TEST + '/'):
        return TEST + key[len(OLD_TEST):]
    return key


def upgraded(log):
    """``log`` (a LogReport's list of entries) with the keys of older
    versions renamed (``upgraded_key``); a new list, of new dicts."""
    return [{upgraded_key(key): value for key, value in entry.items()}
            for entry in log]


def read(path):
    """The log at ``path`` (a LogReport's JSON), with ``upgraded`` keys."""
    with open(path) as f:
        return upgraded(json.load(f))
