"""The alerting rules shipped in the package (django_delayqueue/contrib/prometheus/alerts.yml):
they load as a rules file, fire (and stay quiet) as tests/docs/alerts_test.yml says, use only
metrics the app exports, and are package data."""

from __future__ import annotations

import configparser
import fnmatch
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from ci_support import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "django_delayqueue" / "contrib" / "prometheus" / "alerts.yml"
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


def exported_names() -> set[str]:
    """Every series name metrics/ can export."""
    from django_delayqueue.monitoring import metrics, timing_metrics

    names = {f"delayqueue_redis_{n}" for n in metrics.SERVER_FAMILIES}
    names |= {f"delayqueue_schedule_{n}" for n in metrics.SCHEDULE_FAMILIES}
    for name, (kind, _, _) in metrics.FAMILIES.items():
        names.add(f"delayqueue_{name}_total" if kind == "counter" else f"delayqueue_{name}")
    for metric, _ in timing_metrics.HISTOGRAM_FAMILIES.values():
        names |= {metric, f"{metric}_bucket", f"{metric}_sum", f"{metric}_count"}
    names.add(f"{timing_metrics.OUTCOMES_FAMILY}_total")
    return names


def test_the_rules_use_only_metrics_the_app_exports() -> None:
    used = set(re.findall(r"\bdelayqueue_[a-z_]+", RULES.read_text()))
    assert used, "no metric found in the rules"
    assert used <= exported_names(), sorted(used - exported_names())


def test_the_rules_are_package_data() -> None:
    """setup.cfg's package_data ships the file in the wheel (include_package_data is off)."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    patterns = config["options.package_data"]["django_delayqueue"].split()
    relative = RULES.relative_to(ROOT / "django_delayqueue").as_posix()
    assert any(fnmatch.fnmatch(relative, p) for p in patterns), patterns
