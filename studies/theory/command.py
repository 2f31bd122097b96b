r"""The paper's theory, measured: three figures for docs/theory.md.

  python -m studies.theory --config=studies/theory/config.py --workdir=workdir/theory

1. Free energy F_β = H − β⁻¹·ĥ along a run (ĥ the k-NN entropy of the cloud;
   ``diagnostics.free_energy``): the McKean–Vlasov flow decreases F_β.
2. Sliced 2-Wasserstein distance between the final clouds of runs with N and
   2N particles (same data, independent draws): should shrink as N grows if the
   empirical measure converges (propagation of chaos).
3. Spread of the learned kernel matrix across seeds (``diagnostics.kernel_spread``)
   against N for several β: concentration around a deterministic kernel.

All runs are full batch. Writes ``theory.json``, ``theory.md`` (the numbers
behind the figures, with log-log slopes against N) and ``fig_theory_*.png`` in
``--workdir``; given ``--results``, also a copy of ``theory.json`` there (the committed
``results/theory.json``):

  python -m studies.theory --config=studies/theory/config.py --workdir=workdir/theory \
      --results=results/theory.json

``--page_from_results`` reads ``--results`` alone (default ``results/theory.json``) and
rewrites only the ``theory`` block of ``--page`` (``theory.md`` of the run: its command,
commit, date and machine, then the tables) and the three figures in ``--figures``; nothing
is run and nothing else is written, so the committed page regenerates from the committed
file byte for byte:

  python -m studies.theory --page_from_results

With ``--config`` or ``--workdir`` it is one line (``cli.ConfigError``) before any write.
"""

import json
import os

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

import coulomb_jax as cj
from coulomb_jax import diagnostics
from coulomb_jax import hamiltonian as hl
from coulomb_jax.tasks import synthetic
from experiments.analysis import loading
from experiments.analysis import plots
from experiments.common import cli
from experiments.common import outputs
from experiments.common import page_block
from experiments.common import progress as progress_lib
from experiments.common import provenance
from experiments.study import tables


FLAGS = flags.FLAGS
RESULTS = 'results/theory.json'
FIGURES = ('fig_theory_free_energy.png', 'fig_theory_sw_vs_n.png',
           'fig_theory_kernel_spread.png')
WORKDIR_FILES = ('theory.json', 'theory.md') + FIGURES
BEGIN = '<!-- theory:begin (written by python -m studies.theory --page_from_results) -->'
END = '<!-- theory:end -->'
# Refused with --page_from_results: the flags of a run.
RUN_FLAGS = ('config', 'workdir')


def _energy_kwargs(config):
  d = config.dynamics
  return dict(feature_map=d.feature_map, lam=d.lam, s=d.s, softening=d.softening)


class Runs:
  """Progress of the Langevin runs: "compiling …" before each new shape, then a line per run."""

  def __init__(self, total):
    self.progress = progress_lib.Progress('theory', total=total, unit='run', every=2.0)
    self._shapes = set()

  def langevin(self, what, omega0, *args, num_epochs, **kwargs):
    shape = (omega0.shape, num_epochs)
    if shape not in self._shapes:
      self.progress.say(f'{what}: compiling the Langevin run (N={omega0.shape[0]}, '
                        f'{num_epochs} steps) …')
      self._shapes.add(shape)
    out = cj.run_langevin(*args[:1], omega0, *args[1:], num_epochs=num_epochs, **kwargs)
    jax.block_until_ready(out)
    self.progress.update(what)
    return out


def count_runs(config):
  """The Langevin runs of ``run_theory``: snapshots, N-vs-2N pairs, spread seeds."""
  return (len(config.free_energy_betas) * config.dynamics.num_snapshots
          + 2 * len(config.sw_particles) * config.num_seeds
          + len(config.spread_betas) * len(config.spread_particles) * config.num_seeds)


def run(config, key, x, y, num_particles, beta, num_epochs, return_initial=False, runs=None,
        what=''):
  """One full-batch run from ω ~ N(0, σ_k⁻² I); returns the final (and initial) particles."""
  d = config.dynamics
  runs = runs or Runs(0)
  init_key, run_key = jax.random.split(key)
  omega0 = cj.sample_gaussian(init_key, num_particles, x.shape[1]) / d.bandwidth
  omega, _ = runs.langevin(what, omega0, run_key, x, y, **_energy_kwargs(config),
                           step_size=d.step_size, beta=beta, radius=d.radius,
                           num_epochs=num_epochs)
  return (omega, omega0) if return_initial else omega


def free_energy_curves(config, key, x, y, runs=None):
  """{β: [(step, H, ĥ, F)]} along one run per β, snapshots every num_steps/num_snapshots."""
  d = config.dynamics
  chunk = d.num_steps // d.num_snapshots
  runs = runs or Runs(0)
  out = {}
  for beta in config.free_energy_betas:
    init_key, run_key = jax.random.split(jax.random.fold_in(key, int(beta)))
    omega = cj.sample_gaussian(init_key, config.free_energy_particles, x.shape[1]) / d.bandwidth
    rows = []
    for snap in range(d.num_snapshots + 1):
      h = float(hl.hamiltonian(omega, x, y, **_energy_kwargs(config)))
      ent = float(diagnostics.knn_entropy(omega))
      rows.append((snap * chunk, h, ent, float(diagnostics.free_energy(h, omega, beta))))
      if snap < d.num_snapshots:
        omega, _ = runs.langevin(f'free energy β={beta:g} snapshot {snap + 1}/{d.num_snapshots}',
                                 omega, jax.random.fold_in(run_key, snap), x, y,
                                 **_energy_kwargs(config), step_size=d.step_size, beta=beta,
                                 radius=d.radius, num_epochs=chunk)
    out[beta] = rows
    runs.progress.say(f'free energy, β={beta:g}: F {rows[0][3]:+.4f} → {rows[-1][3]:+.4f}')
  return out


def sw_vs_n(config, key, x, y, runs=None):
  """({N: [SW₂(run N, run 2N)]}, {N: [SW₂(initial N, initial 2N)]}) per seed.

  The second is the reference: two independent i.i.d. clouds also get closer as
  N grows, so the learned clouds' rate is read against it.
  """
  learned, initial = {}, {}
  runs = runs or Runs(0)
  for n in config.sw_particles:
    learned[n], initial[n] = [], []
    for seed in range(config.num_seeds):
      k = jax.random.fold_in(jax.random.fold_in(key, n), seed)
      what = f'N vs 2N, N={n} seed {seed + 1}/{config.num_seeds}'
      a, a0 = run(config, jax.random.fold_in(k, 0), x, y, n, config.sw_beta,
                  config.dynamics.num_steps, return_initial=True, runs=runs, what=what)
      b, b0 = run(config, jax.random.fold_in(k, 1), x, y, 2 * n, config.sw_beta,
                  config.dynamics.num_steps, return_initial=True, runs=runs, what=what)
      sw_key = jax.random.fold_in(k, 2)
      learned[n].append(float(diagnostics.sliced_wasserstein(sw_key, a, b,
                                                             config.sw_projections)))
      initial[n].append(float(diagnostics.sliced_wasserstein(sw_key, a0, b0,
                                                             config.sw_projections)))
    runs.progress.say(f'SW(N={n}, 2N={2 * n}): learned {np.mean(learned[n]):.4f}, '
                      f'initial {np.mean(initial[n]):.4f}')
  return learned, initial


def spread_vs_n_beta(config, key, x, y, x_eval, runs=None):
  """{β: {N: kernel spread across seeds}} of the learned kernel on x_eval."""
  fm = cj.get_feature_map(config.dynamics.feature_map)
  runs = runs or Runs(0)
  out = {}
  for beta in config.spread_betas:
    out[beta] = {}
    for n in config.spread_particles:
      phis = [fm(x_eval, run(config, jax.random.fold_in(jax.random.fold_in(key, n), seed),
                             x, y, n, beta, config.dynamics.num_steps, runs=runs,
                             what=f'kernel spread β={beta:g} N={n} seed {seed + 1}/'
                                  f'{config.num_seeds}'))
              for seed in range(config.num_seeds)]
      out[beta][n] = float(diagnostics.kernel_spread(jnp.stack(phis)))
      runs.progress.say(f'kernel spread β={beta:g} N={n}: {out[beta][n]:.4f}')
  return out


def from_json(results):
  """``results`` as read back from ``theory.json``: its keys, strings in JSON, made the
  numbers ``run_theory`` keyed them by again (β floats, N ints); order kept."""
  return {**results,
          'free_energy': {float(b): rows for b, rows in results['free_energy'].items()},
          'sliced_wasserstein': {int(n): v for n, v in results['sliced_wasserstein'].items()},
          'sliced_wasserstein_initial': {
              int(n): v for n, v in results['sliced_wasserstein_initial'].items()},
          'kernel_spread': {float(b): {int(n): v for n, v in by_n.items()}
                            for b, by_n in results['kernel_spread'].items()}}


def figures(results, workdir):
  """The three ``FIGURES`` of ``results`` in the folder ``workdir``, each written
  atomically (``plots.save``: the same numbers give the same bytes)."""
  plt = plots.pyplot()
  fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
  for beta, rows in results['free_energy'].items():
    steps, h, ent, f = map(np.asarray, zip(*rows))
    axes[0].plot(steps, f, label=f'β={float(beta):g}')
    axes[1].plot(steps, h, label=f'β={float(beta):g}')
    axes[2].plot(steps, ent, label=f'β={float(beta):g}')
  for ax, title in zip(axes, ('free energy F = H − ĥ/β', 'H (full batch)', 'k-NN entropy ĥ')):
    ax.set(xlabel='step', title=title)
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  plots.save(fig, os.path.join(workdir, 'fig_theory_free_energy.png'))        # atomic

  fig, ax = plt.subplots(figsize=(5, 3.6))
  ns = sorted(int(n) for n in results['sliced_wasserstein'])
  for name, field in (('learned clouds', 'sliced_wasserstein'),
                      ('initial i.i.d. clouds', 'sliced_wasserstein_initial')):
    vals = [results[field][n] for n in ns]
    ax.errorbar(ns, [np.mean(v) for v in vals],
                yerr=[np.std(v, ddof=1) if len(v) > 1 else 0 for v in vals], marker='o',
                capsize=3, label=name)
  ax.set(xscale='log', yscale='log', xlabel='N', ylabel='SW₂(cloud N, cloud 2N)',
         title='N vs 2N particle clouds')
  ax.legend(fontsize=8)
  ax.set_xticks(ns, [str(n) for n in ns])
  fig.tight_layout()
  plots.save(fig, os.path.join(workdir, 'fig_theory_sw_vs_n.png'))        # atomic

  fig, ax = plt.subplots(figsize=(5, 3.6))
  for beta, by_n in results['kernel_spread'].items():
    ns = sorted(int(n) for n in by_n)
    ax.plot(ns, [by_n[n] for n in ns], marker='o', label=f'β={float(beta):g}')
  ax.set(xscale='log', yscale='log', xlabel='N', ylabel='kernel spread across seeds',
         title='Concentration of the learned kernel')
  ax.legend(fontsize=8)
  fig.tight_layout()
  plots.save(fig, os.path.join(workdir, 'fig_theory_kernel_spread.png'))        # atomic


def summary_markdown(results):
  """Tables of the three measurements, with least-squares log-log slopes in N."""
  slope = lambda ns, v: float(np.polyfit(np.log(ns), np.log(v), 1)[0])
  lines = [f"Command: `{results['command']}`  ", f"Commit: {results['commit']}  ",
           f"Date: {results['date']}  ", f"Machine: {json.dumps(results['machine'])}", '',
           '### Free energy along one run (N = '
           f"{results['config']['free_energy_particles']})", '',
           '| β | F at start | F at end | steps where F rose (of snapshots) | largest rise |',
           '|---|---|---|---|---|']
  for beta, rows in results['free_energy'].items():
    f = np.array([r[3] for r in rows])
    d = np.diff(f)
    lines.append(f'| {float(beta):g} | {f[0]:+.4f} | {f[-1]:+.4f} | {int((d > 0).sum())} of '
                 f'{len(d)} | {max(d.max(), 0.0):.4f} |')
  ns = sorted(int(n) for n in results['sliced_wasserstein'])
  lines += ['', '### Sliced W₂ between clouds of N and 2N particles (mean ± std over seeds)', '',
            '| clouds \\ N | ' + ' | '.join(map(str, ns)) + ' | log-log slope |',
            '|---|' + '---|' * (len(ns) + 1)]
  for name, field in (('learned (after the run)', 'sliced_wasserstein'),
                      ('initial i.i.d. draws', 'sliced_wasserstein_initial')):
    sw = [results[field][n] for n in ns]
    lines.append(f'| {name} | ' + ' | '.join(
        f'{np.mean(v):.4f} ± {np.std(v, ddof=1):.4f}' if len(v) > 1 else f'{np.mean(v):.4f}'
        for v in sw) + f' | {slope(ns, [np.mean(v) for v in sw]):.2f} |')
  lines += ['', '### Spread of the learned kernel across seeds', '']
  first = next(iter(results['kernel_spread'].values()))
  ns = sorted(int(n) for n in first)
  lines += ['| β \\ N | ' + ' | '.join(map(str, ns)) + ' | log-log slope |',
            '|---|' + '---|' * (len(ns) + 1)]
  for beta, by_n in results['kernel_spread'].items():
    v = [by_n[n] for n in ns]
    lines.append(f'| {float(beta):g} | ' + ' | '.join(f'{x:.4f}' for x in v)
                 + f' | {slope(ns, v):.2f} |')
  return '\n'.join(lines) + '\n'


def page_lines(results) -> list:
  """The lines of the page's ``theory`` block: ``summary_markdown`` (``theory.md``)."""
  return summary_markdown(results).rstrip('\n').split('\n')


def write_page(results, page: str, figures_dir: str) -> None:
  """The three figures of ``results`` in ``figures_dir`` and the ``theory`` block of
  ``page`` (``page_lines``), each replaced atomically."""
  lines = page_lines(results)
  figures(results, figures_dir)
  page_block.write_block(page, BEGIN, END, lines)


def run_theory(config, workdir, results_path=None):
  """The study: ``theory.json``, ``theory.md`` and the figures in ``workdir``; with
  ``results_path``, ``theory.json`` (the same bytes) there too. Returns the results as
  read back from ``theory.json`` (``from_json``), from which the rest is written."""
  meta = tables.run_metadata('studies.theory')
  key = jax.random.key(config.seed)
  data_key, eval_key, fe_key, sw_key, spread_key = jax.random.split(key, 5)
  x, y = synthetic.make_classification(data_key, config.data.num_train, config.data.dim,
                                       config.data.noise)
  x_eval, _ = synthetic.make_classification(eval_key, config.data.num_eval, config.data.dim,
                                            config.data.noise)
  runs = Runs(count_runs(config))
  runs.progress.say(f'{runs.progress.total} Langevin runs: free energy, N vs 2N clouds, '
                    f'kernel spread; workdir {workdir}')
  sw_learned, sw_initial = sw_vs_n(config, sw_key, x, y, runs)
  results = {**meta, 'config': config.to_dict(),
             'free_energy': free_energy_curves(config, fe_key, x, y, runs),
             'sliced_wasserstein': sw_learned, 'sliced_wasserstein_initial': sw_initial,
             'kernel_spread': spread_vs_n_beta(config, spread_key, x, y, x_eval, runs)}
  os.makedirs(workdir, exist_ok=True)
  text = json.dumps(results, indent=1)
  provenance.write_atomic(os.path.join(workdir, 'theory.json'), text)
  if results_path:
    provenance.write_atomic(results_path, text)
  # The markdown and figures come from the file, as --page_from_results reads it.
  results = from_json(json.loads(text))
  provenance.write_atomic(os.path.join(workdir, 'theory.md'), summary_markdown(results))
  print(summary_markdown(results))
  figures(results, workdir)
  return results


def _refuse_run_flags() -> None:
  """One ``cli.ConfigError`` naming the first of ``RUN_FLAGS`` given on the command line
  (``--config`` by its file): ``--page_from_results`` runs nothing."""
  if FLAGS['config'].present:
    raise cli.ConfigError(f'--page_from_results writes only the page from --results; drop '
                          f"--config={config_flags.get_config_filename(FLAGS['config'])}.")
  cli.refuse_beside_page_from_results('--results', RUN_FLAGS[1:])


def page_from_results() -> None:
  """``--page_from_results``: reads ``--results`` alone; redraws the three figures in
  ``--figures`` and rewrites ``--page``'s ``theory`` block. Every refusal comes before the
  first write."""
  _refuse_run_flags()
  if not os.path.isfile(FLAGS.results):
    raise cli.ConfigError(f'--results: {FLAGS.results!r} is not a file (--page_from_results '
                          'reads it).')
  outputs.check_file('--page', FLAGS.page)
  outputs.check_folder('--figures', FLAGS.figures)
  for name in FIGURES:
    outputs.check_file('--figures', os.path.join(FLAGS.figures, name), folder_must_exist=False)
  try:
    results = from_json(loading.read_json(FLAGS.results))
    page_lines(results)
  except (AttributeError, KeyError, IndexError, TypeError, ValueError) as e:
    if isinstance(e, cli.ConfigError):
      raise
    raise cli.ConfigError(f'--results: {FLAGS.results}: not the theory.json of studies.theory '
                          f'({e!r}); nothing was written.') from None
  write_page(results, FLAGS.page, FLAGS.figures)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if FLAGS.page_from_results:
    page_from_results()
    return
  for name in RUN_FLAGS:
    if FLAGS[name].value is None:
      raise cli.ConfigError(f'--{name}: required for a run (or --page_from_results, which '
                            'reads --results alone).')
  for name in ('page', 'figures'):
    if FLAGS[name].present:
      raise cli.ConfigError(f'--{name}={FLAGS[name].value}: only with --page_from_results; a '
                            'run would ignore it. Nothing was run or written.')
  # before any compute (issue 39 item 1)
  outputs.check_folder('--workdir', FLAGS.workdir)
  outputs.check_files_in('--workdir', FLAGS.workdir, WORKDIR_FILES)
  results_path = FLAGS.results if FLAGS['results'].present else None
  if results_path:
    outputs.check_file('--results', results_path)
  run_theory(FLAGS.config, FLAGS.workdir, results_path)


def launch() -> None:
  """Defines the flags and runs the command: ``python -m studies.theory``."""
  # Flags are defined here, not at import, so tests can import every experiment module.
  config_flags.DEFINE_config_file('config', None, 'Theory config.', lock_config=True)
  flags.DEFINE_string('workdir', None, 'Directory for theory.json, theory.md and figures.')
  flags.DEFINE_string('results', RESULTS, 'The committed results file: a run given it also '
                      'writes its theory.json there; --page_from_results reads it.')
  cli.define_page_flags('theory', 'three figures', 'docs/theory.md')
  cli.run(main)
