"""coulomb_jax: learned random-feature kernels as Coulomb particles, in JAX."""

import setuptools

setuptools.setup(
    name='coulomb_jax',
    version='0.1.0',
    description=('Learned random-feature kernels as interacting Coulomb particles '
                 '(projected Langevin dynamics) in JAX.'),
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    # The library and the three floors above it, so that every command runs as
    # `python -m <package>.<module>` (or by path) from any folder, with no sys.path edits:
    # the tools (experiments, their configs), the studies and the benchmarks.
    packages=setuptools.find_packages(include=['coulomb_jax', 'coulomb_jax.*', 'experiments',
                                               'experiments.*', 'configs', 'studies',
                                               'studies.*', 'benchmarks']),
    python_requires='>=3.10',
    # Ranges, not pins: the same code runs on jax 0.10 (CPU, Python 3.11) and on
    # jax 0.11 (the GPU image, Python 3.12), which must not be upgraded there.
    install_requires=[
        'jax>=0.7,<0.13',
        'jaxlib>=0.7,<0.13',
        'flax>=0.10',
        'optax>=0.2.5',
        'chex>=0.1.89',
        'numpy>=1.26',
        'ml-collections>=0.1.1',
        'absl-py>=2.0',
        # coulomb_jax.tasks.data: uncased WordPiece trained on the training split (no network
        # for bert-base-uncased's vocabulary); a fast, well-kept Rust implementation.
        'tokenizers>=0.23',
    ],
    extras_require={
        # The synthetic study's baselines (logistic regression, SVMs) and figures:
        # scikit-learn and matplotlib do these better than code we would write.
        # experiments/train.py: orbax for atomic, resumable checkpoints, tensorboardX to
        # write TensorBoard scalars and hparams without tensorflow, and tensorboard to
        # read them (tensorboard --logdir <workdir>/tensorboard).
        'experiments': ['scikit-learn>=1.3', 'matplotlib>=3.7', 'scipy>=1.10',
                        'orbax-checkpoint>=0.11', 'tensorboardX>=2.6', 'tensorboard>=2.14'],
        # coulomb_jax.tasks.data.tfds_builders / data.load_split(source='tfds'): tfds without tensorflow
        # (array_record files); tfds 4.9.10 imports importlib_resources without declaring it.
        'tfds': ['tensorflow-datasets>=4.9.10', 'importlib_resources', 'array_record>=0.5'],
        # nbclient/nbformat/ipykernel execute the Colab notebooks in the test suite;
        # pytest-xdist runs it on every core (its time is mostly single-threaded compiles).
        'test': ['pytest>=8', 'pytest-xdist>=3.5', 'hypothesis>=6', 'nbclient>=0.9',
                 'nbformat>=5.9', 'ipykernel>=6.25'],
    },
)
