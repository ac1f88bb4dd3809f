"""The parameter shapes that the GPU benchmarks update.

``resnet50``: the arrays of ``chainer.links.ResNet50Layers`` as
``bench_lars.py`` builds it (many small and mid-sized arrays).
``bert_large``: the arrays of BERT-large (Devlin et al. 2019, `arXiv:1810.
04805 <https://arxiv.org/abs/1810.04805>`_; the 24-layer, 1024-wide
encoder with its embeddings and pooler, 335 M parameters), a set of few
large arrays. ``tiny``: a handful of small arrays, for smoke tests on a
CPU.

Each set is a dict: ``name``, ``shapes`` (a list of lists of ints, JSON
ready, so that a process of another framework can read it), ``n_params``,
``n_arrays`` and ``source``. Only ``resnet50`` needs Chainer (to build the
link once, on the CPU).
"""

import os
import sys

SETS = ('resnet50', 'bert_large', 'tiny')

#: BERT-large's configuration (``bert-large-uncased``).
BERT_LARGE = {'vocab': 30522, 'hidden': 1024, 'layers': 24,
              'intermediate': 4096, 'positions': 512, 'token_types': 2}


def bert_shapes(vocab, hidden, layers, intermediate, positions,
                token_types):
    """The parameter shapes of a BERT encoder with its pooler, in the
    order of the reference implementation: embeddings (word, position,
    token type, LayerNorm), then per layer the query, key, value and
    output projections with their biases, the attention's LayerNorm, the
    feed-forward pair and the output LayerNorm, then the pooler."""
    shapes = [[vocab, hidden], [positions, hidden], [token_types, hidden],
              [hidden], [hidden]]
    for _ in range(layers):
        for _ in range(4):  # query, key, value, attention output
            shapes += [[hidden, hidden], [hidden]]
        shapes += [[hidden], [hidden]]  # LayerNorm
        shapes += [[intermediate, hidden], [intermediate],
                   [hidden, intermediate], [hidden]]
        shapes += [[hidden], [hidden]]  # LayerNorm
    shapes += [[hidden, hidden], [hidden]]  # pooler
    return shapes


def resnet50_shapes():
    """The shapes of ResNet-50's arrays, from ``bench_lars.build_model``."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import bench_lars
    link = bench_lars.build_model('resnet50', 'float32')
    return [list(p.shape) for _, p in sorted(link.namedparams())]


def get(name):
    """The shape set ``name`` (one of :data:`SETS`) as a dict."""
    if name == 'resnet50':
        shapes = resnet50_shapes()
        source = 'chainer.links.ResNet50Layers(pretrained_model=None)'
    elif name == 'bert_large':
        shapes = bert_shapes(**BERT_LARGE)
        source = 'BERT-large (24 layers of 1024, vocabulary 30522)'
    elif name == 'tiny':
        shapes = [[16, 8], [16], [4, 3, 3, 3], [4], [10, 16], [10]]
        source = 'six small arrays (smoke tests)'
    else:
        raise ValueError('unknown shape set {!r}; choose from {}'.format(
            name, ', '.join(SETS)))
    n_params = 0
    for shape in shapes:
        size = 1
        for n in shape:
            size *= n
        n_params += size
    return {'name': name, 'shapes': shapes, 'n_params': n_params,
            'n_arrays': len(shapes), 'source': source}
