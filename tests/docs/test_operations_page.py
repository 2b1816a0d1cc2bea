"""docs/operations.md: its Kubernetes manifests and Prometheus configuration are what they say.

The YAML blocks parse; the Prometheus block passes ``promtool check config`` (with its token
file and rule file where it names them, in a directory of the test's), with the shipped rules
as its rule file; the probes ask what the endpoints answer (``health/?check=redis``, the
liveness module runqueue's ``--alive-file`` feeds)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from ci_support import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "operations.md"
RULES = ROOT / "django_delayqueue" / "contrib" / "prometheus" / "alerts.yml"


def yaml_blocks() -> list[str]:
    return re.findall(r"^```yaml\n(.*?)^```$", PAGE.read_text(), re.S | re.M)


def test_the_kubernetes_manifests_probe_what_the_app_serves() -> None:
    manifests = [d for block in yaml_blocks() for d in yaml.safe_load_all(block) if "kind" in d]
    by_name = {m["metadata"]["name"]: m for m in manifests}
    (web,) = by_name["shop-web"]["spec"]["template"]["spec"]["containers"]
    probe = web["readinessProbe"]["httpGet"]
    assert probe["path"] == "/delayqueue/health/?check=redis"
    assert {h["name"] for h in probe["httpHeaders"]} == {"Host", "Authorization"}
    worker = by_name["shop-worker"]["spec"]["template"]["spec"]
    (runqueue,) = worker["containers"]
    alive = next(a for a in runqueue["command"] if a.startswith("--alive-file="))
    path = alive.split("=", 1)[1]
    command = runqueue["livenessProbe"]["exec"]["command"]
    assert command[:3] == ["python", "-m", "django_delayqueue.alive"] and path in command
    grace = next(a for a in runqueue["command"] if a.startswith("--grace="))
    assert worker["terminationGracePeriodSeconds"] > float(grace.split("=", 1)[1])


def test_the_prometheus_configuration_passes_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        skip_or_fail("promtool not found (Debian: apt-get install prometheus)")
    (block,) = [b for b in yaml_blocks() if b.startswith("# prometheus.yml")]
    config: dict[str, Any] = yaml.safe_load(block)
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/delayqueue/metrics/"
    assert job["authorization"]["type"] == "Bearer"
    token = tmp_path / "delayqueue-token"
    token.write_text("s3cret-token-for-probes-0123456789\n")
    rules = tmp_path / "delayqueue-alerts.yml"
    shutil.copy(RULES, rules)
    text = block.replace(job["authorization"]["credentials_file"], str(token))
    text = text.replace(config["rule_files"][0], str(rules))
    (tmp_path / "prometheus.yml").write_text(text)
    done = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
