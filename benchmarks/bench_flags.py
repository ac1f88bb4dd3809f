"""What the benchmark scripts check of their flags before they run.

A bad flag ends the script in one line that names it (``parser.error``:
the usage, then that line, exit status 2) before anything is loaded or
timed, instead of a traceback from inside the run or at its end.
"""

import os


def output_file(parser, flag, path):
    """Makes the folder of the output file ``path`` (``flag``'s value)
    now, so that a run does not end in ``FileNotFoundError`` when it
    writes; a usage error where the file cannot be written there."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        parser.error('{} {}: cannot make its folder {} ({})'.format(
            flag, path, folder, e.strerror or e))
    if os.path.isdir(path):
        parser.error('{} {}: is a folder, not a file'.format(flag, path))
    if not os.access(folder, os.W_OK):
        parser.error('{} {}: cannot write in {}'.format(flag, path, folder))


def device(parser, spec, flag='--device'):
    """The Chainer device ``spec`` names, or a usage error in one line
    (an unknown specifier, a GPU where CuPy cannot be used or that this
    machine lacks, a ChainerX device)."""
    import chainer
    import numpy
    try:
        found = chainer.get_device(spec)
    except (ValueError, RuntimeError) as e:
        if (not chainer.backends.cuda.available
                and str(e).startswith('CUDA environment')):
            # Chainer's message runs two sentences together.
            e = 'CuPy cannot be used ({})'.format(' '.join(str(
                chainer.backends.cuda._resolution_error).split()))
        parser.error('{} {}: {}'.format(flag, spec, ' '.join(
            str(e).split())))
    if found.xp is chainer.backend.chainerx:
        parser.error('{} {}: ChainerX devices are not benchmarked; use '
                     '@numpy or @cupy:N'.format(flag, spec))
    if found.xp is not numpy:
        import cupy
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except cupy.cuda.runtime.CUDARuntimeError as e:
            parser.error('{} {}: no usable GPU ({})'.format(flag, spec, e))
        if found.device.id >= count:
            parser.error('{} {}: no such GPU, this machine has {}'.format(
                flag, spec, count))
    return found
