"""The study settings that live in configs (issue 37 item 4): the defaults are the settings
of the committed results, and a bad field is refused in one line naming it, before any
compute."""

import json
import os

import pytest

from experiments.common import cli
from studies.phase_a_drift import command as drift
from studies.phase_a_drift import config as drift_config
from studies.phase_a_pilot import command as pilot
from studies.phase_a_pilot import config as pilot_config
from studies.tfidf_baseline import command as tfidf
from studies.tfidf_baseline import config as tfidf_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _results(*path):
  with open(os.path.join(ROOT, 'results', *path), encoding='utf-8') as f:
    return json.load(f)


def test_the_defaults_are_the_settings_of_the_committed_results():
  committed = _results('phase_a_pilot_rotten_tomatoes.json')
  config = pilot_config.get_config()
  assert (config.dataset, config.seed) == (committed['dataset'], committed['seed'])
  assert {n: pilot_config.SETTINGS[n] for n in config.settings} == committed['settings']
  assert set(config.feature_maps) == set(committed['rows']['paper'])

  config = drift_config.get_config()
  for dataset in ('rotten_tomatoes', 'sst2', 'qqp_subset'):
    committed = _results(f'phase_a_drift_{dataset}.json')
    assert list(config.feature_maps) == list(committed['maps'])
    assert {r['batches'] for r in committed['maps'].values()} == {config.batches}

  config = tfidf_config.get_config()
  assert tfidf.check_config(config) == list(config.c_grid)
  for task in config.tasks:
    assert _results('tfidf', f'{task}.json')['config']['c_grid'] == list(config.c_grid)


def _refused(check, config, field, value):
  config.unlock()
  config[field] = value
  with pytest.raises(cli.ConfigError) as e:
    check(config)
  message = str(e.value)
  assert message.startswith(f'--config.{field}') and '\n' not in message, message
  return message


@pytest.mark.parametrize('field, value', [
    ('dataset', 'imdb'), ('settings', ('learn', 'step_0.3')), ('settings', ()),
    ('feature_maps', ('elu', 'relu')), ('phase_a_epochs', -1)])
def test_the_pilot_refuses_a_bad_field_naming_it(field, value):
  pilot.check_config(pilot_config.get_config())
  message = _refused(pilot.check_config, pilot_config.get_config(), field, value)
  if field == 'settings' and value:
    assert "['step_0.3']" in message


@pytest.mark.parametrize('field, value', [
    ('dataset', 'imdb'), ('feature_maps', ('favorr',)), ('batches', 0)])
def test_the_drift_measurement_refuses_a_bad_field_naming_it(field, value):
  drift.check_config(drift_config.get_config())
  _refused(drift.check_config, drift_config.get_config(), field, value)


@pytest.mark.parametrize('field, value', [
    ('tasks', ('sst2', 'imdb')), ('c_grid', (1.0, -2.0)), ('validation_rule', 'words'),
    ('validation_rule', 'sentences')])
def test_the_tfidf_row_refuses_a_bad_field_naming_it(field, value):
  message = _refused(tfidf.check_config, tfidf_config.get_config(), field, value)
  if value == 'sentences':                 # sst2 only; the three tasks are refused
    config = tfidf_config.get_config()
    config.validation_rule, config.tasks = 'sentences', ('sst2',)
    assert tfidf.check_config(config) == list(config.c_grid)
    assert 'sst2 only' in message
