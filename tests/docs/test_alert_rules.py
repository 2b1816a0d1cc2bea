"""The alerting rules shipped in the package (django_delayqueue/contrib/prometheus/alerts.yml):
they load as a rules file, fire (and stay quiet) as tests/docs/alerts_test.yml says, use only
metrics the app exports, and are package data."""

from __future__ import annotations

import configparser
import fnmatch
import shutil
import subprocess
from pathlib import Path

import pytest
from ci_support import skip_or_fail
from exported_metrics import METRIC_NAME, exported_names

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "django_delayqueue" / "contrib" / "prometheus" / "alerts.yml"
# The Grafana dashboard next to it: tests/app/test_prometheus.py runs its queries.
DASHBOARD = RULES.parent / "grafana-dashboard.json"
UNIT_TESTS = Path(__file__).resolve().parent / "alerts_test.yml"


@pytest.fixture
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        skip_or_fail("promtool not found (Debian: apt-get install prometheus)")
    return found


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)


def test_the_rules_load_as_a_rules_file(promtool: str) -> None:
    done = run(promtool, "check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 8 rules found" in done.stdout


def test_the_rules_fire_as_their_unit_tests_say(promtool: str) -> None:
    done = run(promtool, "test", "rules", str(UNIT_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_rules_use_only_metrics_the_app_exports() -> None:
    used = set(METRIC_NAME.findall(RULES.read_text()))
    assert used, "no metric found in the rules"
    assert used <= exported_names(), sorted(used - exported_names())


@pytest.mark.parametrize("shipped", [RULES, DASHBOARD], ids=["rules", "dashboard"])
def test_the_rules_and_the_dashboard_are_package_data(shipped: Path) -> None:
    """setup.cfg's package_data ships the files in the wheel (include_package_data is off)."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    patterns = config["options.package_data"]["django_delayqueue"].split()
    relative = shipped.relative_to(ROOT / "django_delayqueue").as_posix()
    assert any(fnmatch.fnmatch(relative, p) for p in patterns), patterns
